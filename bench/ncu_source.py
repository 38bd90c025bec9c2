#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page
(`ncu --import REPORT --page source --csv --print-source sass`, as scripts/profile_moe.sh --full
writes it next to the report).

    python3 bench/ncu_source.py PROFILE_source.csv [--top N] [--json OUT.json]

Per kernel of the file: its stall samples by reason (ncu's PC sampling: every sample is one warp
and the reason it did not issue, or "selected" when it did), the share of samples per instruction
kind (the opcode, e.g. HGMMA, LOP3, SYNCS, with uniform-datapath opcodes as one kind), and the N
instructions with the most samples, each with its three leading reasons. Shares are of the kernel's
samples. Exit status 1 when the file holds no source rows (the import failed: its message is in
the file).
"""
import argparse
import collections
import csv
import json
import re
import sys

from ncu_durations import short_name

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(text):
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def read_kernels(path):
    """[(kernel name, [row dict, ...]), ...] in file order; ncu writes one block per kernel: a
    "Kernel Name" line, then a header line starting with "Address", then one line per instruction."""
    kernels, header = [], None
    for row in csv.reader(open(path, newline="")):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append((row[1] if len(row) > 1 else "?", []))
            header = None
        elif row[0] == "Address" and kernels:
            header = row
        elif header and kernels:
            kernels[-1][1].append(dict(zip(header, row)))
    return [(name, rows) for name, rows in kernels if rows and SAMPLES in rows[0]]


def opcode_kind(source):
    """'@!P0 LDS.128 R8, [R15+0x600]' -> 'LDS'; uniform-datapath opcodes (UIADD3, ULOP3, ...) -> 'U*'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    if not words:
        return "?"
    op = words[0].split(".")[0]
    return "U*" if re.fullmatch(r"U[A-Z0-9]+", op) else op


def summarize(rows, top):
    reasons = [h for h in rows[0] if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(number(r[SAMPLES]) for r in rows)
    by_reason = collections.Counter()
    by_kind = collections.Counter()
    for r in rows:
        s = number(r[SAMPLES])
        by_kind[opcode_kind(r.get("Source", ""))] += s
        for h in reasons:
            by_reason[h[len("stall_"):]] += number(r.get(h, ""))
    ranked = sorted(rows, key=lambda r: -number(r[SAMPLES]))[:top]
    share = (lambda v: 100.0 * v / total) if total else (lambda v: 0.0)
    return {
        "samples": total,
        "reasons": [[k, round(share(v), 2)] for k, v in by_reason.most_common() if v],
        "kinds": [[k, round(share(v), 2)] for k, v in by_kind.most_common() if v],
        "top": [{"address": r.get("Address", ""), "source": r.get("Source", "").strip(),
                 "share": round(share(number(r[SAMPLES])), 2),
                 "reasons": [[h[len("stall_"):], number(r[h])]
                             for h in sorted(reasons, key=lambda h: -number(r.get(h, "")))[:3] if number(r.get(h, ""))]}
                for r in ranked if number(r[SAMPLES])],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    kernels = read_kernels(a.csv)
    if not kernels:
        print(f"ncu_source: no source rows with '{SAMPLES}' in {a.csv}", file=sys.stderr)
        return 1
    out = []
    for name, rows in kernels:
        s = summarize(rows, a.top)
        out.append(dict(kernel=name, **s))
        print(f"{short_name(name)}: {s['samples']:.0f} samples")
        print("  reasons: " + ", ".join(f"{k} {v:.1f}%" for k, v in s["reasons"][:8]))
        print("  kinds:   " + ", ".join(f"{k} {v:.1f}%" for k, v in s["kinds"][:10]))
        for t in s["top"]:
            why = " ".join(f"{k}:{v:.0f}" for k, v in t["reasons"])
            print(f"  {t['share']:5.2f}%  {t['source'][:64]:64}  {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
