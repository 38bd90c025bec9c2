#!/usr/bin/env python3
"""Fails when ptxas serializes the wgmma instructions of any kernel that uses them.

ptxas reports it only as an "info" line of the build ("(C7512) Potential Performance Loss:
wgmma.mma_async instructions are serialized due to insufficient register resources ..."; C7513
and its siblings name other causes): the kernel still runs and passes every test, just slower.
On 2026-12-05 a branch's 176-wide prefill tile carried C7512 through a device run that measured
it 4-14 % slower than the kernel before (docs/performance.md, sixth session) before anyone read
the build log. This check recompiles each translation unit that includes a wgmma kernel header
(src/cuda/moe/gemm.cuh, gemm_prefill.cuh) with its own command from the build's
compile_commands.json, into a temporary object, and fails naming the kernel and the reason.

    python3 tests/scripts/check_wgmma_serialization.py build

Exit 77 (ctest: skipped, with the reason) when the build has no CUDA translation units.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WGMMA_HEADERS = ("gemm.cuh", "gemm_prefill.cuh")
SERIALIZED = re.compile(r"\((C75\d\d)\)[^\n]*wgmma\.mma_async instructions are serialized ([^\n]*)")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def wgmma_units(entries):
    """The compile_commands entries of CUDA sources that include a wgmma kernel header."""
    units = []
    for entry in entries:
        path = entry["file"]
        if not path.endswith(".cu") or not os.path.isfile(path):
            continue
        with open(path) as f:
            included = {os.path.basename(h) for h in INCLUDE.findall(f.read())}
        if included & set(WGMMA_HEADERS):
            units.append(entry)
    return units


def recompile(entry, obj):
    """The entry's command with its object written to `obj`; returns (exit code, output)."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            args[i + 1] = obj
    done = subprocess.run(args, cwd=entry["directory"], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    db = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db):
        print(f"SKIPPED: no {db} (configure with CMAKE_EXPORT_COMPILE_COMMANDS, as CMakeLists.txt does)")
        return 77
    with open(db) as f:
        entries = json.load(f)
    if not any(e["file"].endswith(".cu") for e in entries):
        print("SKIPPED: the build has no CUDA translation units (no CUDA compiler at configure time)")
        return 77
    units = wgmma_units(entries)
    if not units:
        print(f"FAILED: no CUDA source includes {' or '.join(WGMMA_HEADERS)}: this check's list is stale")
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, entry in enumerate(units):
            name = os.path.relpath(entry["file"], ROOT)
            rc, out = recompile(entry, os.path.join(tmp, f"{n}.o"))
            if rc != 0:
                print(f"FAILED: {name} did not compile (exit {rc}):\n{out}")
                failures += 1
                continue
            found = SERIALIZED.findall(out)
            for code, why in found:
                print(f"FAILED: {name}: ptxas {code}: wgmma serialized {why.strip()}")
            failures += bool(found)
            if not found:
                print(f"ok: {name}: no wgmma serialized")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
