#!/usr/bin/env python3
"""The size of each GEMM kernel's main loop in SASS, and how two builds differ there.

The prefill GEMMs' consumers are issue-bound in the narrow tile and near it in the others, so the
instructions of their innermost loop (one weight stage: four K-steps of conversion and wgmma) set
their speed. A change outside that loop can still change it: ptxas allocates registers for the
whole kernel. On 2026-12-06 work items taken from a counter added 14 instructions to the narrow
tile's loop (625 -> 639, +2.2 %: its GEMMs took 2-4 % longer) and 59 to the wide tile's (uniform
width compares: UISETP + PLOP3 each) without touching the loop's code (docs/performance.md,
twentieth session). Count them before spending device time:

    python3 bench/sass_loops.py build/bin/bench_moe
    python3 bench/sass_loops.py build/bin/bench_moe --base old/bin/bench_moe   # per-opcode differences
    python3 bench/sass_loops.py --sass dump.txt                                 # cuobjdump -sass output

For every kernel whose name matches --kernels (a regular expression; default the MoE GEMMs), the
innermost loop that holds a tensor-core instruction (HGMMA or HMMA): the shortest instruction range
from a backward branch's target to the branch; in brackets the next larger such loops (the decode
GEMM's shortest is its partial last stage, its stage loop comes next). The count is static: the
loop body holds every path (the prefill tiles' loop holds one wgmma group per tile width, of which
a K-step runs one), so read the opcodes that differ and where they sit, not only the total.
"path N@W" estimates the instructions one pass runs at wgmma width W (the widest in the loop): the
loop without the wgmma groups (WARPGROUP.ARRIVE to the HGMMA that closes the group, and the branch
after it) of other widths; the branches that pick a width stay counted.

--walk START:END[:TAKEN,...] counts what one warp issues along one path instead (one kernel only):
from address START to END, taking the conditional branches at the TAKEN addresses and every
unconditional one; e.g. one full stage of a decode GEMM, from the stage loop's head to its backward
branch (a branch that diverges within a warp runs both sides: walk the side a full stage takes and
add the other's).

cuobjdump comes from --cuobjdump, $CUOBJDUMP, PATH or the CUDA toolkit's bin folder (a toolkit
without it: PyPI's nvidia-cuda-cuobjdump wheel holds it as nvidia/cu13/bin/cuobjdump). Exit status
1 when no kernel matched, 2 on a usage error.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

FUNCTION = re.compile(r"^\s+Function : (\S+)")
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
TENSOR = ("HGMMA", "HMMA")


def parse_sass(text):
    """{kernel name: [(address, instruction)]} from cuobjdump -sass output."""
    kernels, current = {}, None
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return kernels


def opcode(instruction):
    parts = instruction.split()
    return parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]


def tensor_loops(code):
    """Every [target, backward branch] range holding a tensor-core instruction, shortest first."""
    index = {address: i for i, (address, _) in enumerate(code)}
    found = []
    for i, (address, instruction) in enumerate(code):
        m = BRANCH.search(instruction)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= address or target not in index:
            continue
        body = [ins for _, ins in code[index[target]:i + 1]]
        if any(opcode(ins).startswith(TENSOR) for ins in body):
            found.append(body)
    return sorted(found, key=len)


def innermost_tensor_loop(code):
    """The shortest [target, backward branch] range holding a tensor-core instruction, or None."""
    loops = tensor_loops(code)
    return loops[0] if loops else None


WGMMA_WIDTH = re.compile(r"^HGMMA\.\d+x(\d+)x")


def wgmma_groups(loop):
    """[(width, instructions)] of the loop's wgmma groups: from a WARPGROUP.ARRIVE to the HGMMA
    that closes the group (gsb0), with an unconditional branch right after it."""
    groups, i = [], 0
    while i < len(loop):
        if opcode(loop[i]) != "WARPGROUP.ARRIVE":
            i += 1
            continue
        j, width, closed = i + 1, None, False
        while j < len(loop) and opcode(loop[j]) != "WARPGROUP.ARRIVE":
            m = WGMMA_WIDTH.match(opcode(loop[j]))
            if m:
                width = int(m.group(1))
                if "gsb0" in loop[j]:
                    closed = True
                    break
            j += 1
        if not closed:
            i = j
            continue
        if j + 1 < len(loop) and opcode(loop[j + 1]) == "BRA" and not loop[j + 1].startswith("@"):
            j += 1
        groups.append((width, j + 1 - i))
        i = j + 1
    return groups


def path_estimate(loop):
    """(instructions, width): the loop without the wgmma groups of widths other than its widest;
    None when the loop holds no wgmma group."""
    groups = wgmma_groups(loop)
    if not groups:
        return None
    widest = max(w for w, _ in groups)
    return len(loop) - sum(n for w, n in groups if w != widest), widest


def walk(code, start, end, taken):
    """The instructions one warp issues from address `start` to `end` (both included): conditional
    branches at the addresses in `taken` jump, others fall through; unconditional branches jump.
    Raises ValueError when an address is not in the kernel or the path comes back to an
    instruction before reaching `end` (a loop it never leaves)."""
    index = {address: i for i, (address, _) in enumerate(code)}
    for name, address in [("start", start), ("end", end)] + [("taken", a) for a in sorted(taken)]:
        if address not in index:
            raise ValueError(f"{name} address 0x{address:x} is not an instruction of the kernel")
    path, seen, i = [], set(), index[start]
    while True:
        address, instruction = code[i]
        if address in seen:
            raise ValueError(f"the path comes back to 0x{address:x} before 0x{end:x}: a branch to take or not is missing")
        seen.add(address)
        path.append(instruction)
        if address == end:
            return path
        if opcode(instruction) in ("EXIT", "RET") and not instruction.startswith("@"):
            raise ValueError(f"the path exits at 0x{address:x} before 0x{end:x}")
        m = BRANCH.search(instruction)
        if m and (address in taken or not instruction.startswith("@")):
            target = int(m.group(1), 16)
            if target not in index:
                raise ValueError(f"the branch at 0x{address:x} leaves the kernel's code (0x{target:x})")
            i = index[target]
        else:
            i += 1
            if i == len(code):
                raise ValueError(f"the path runs off the kernel's end before 0x{end:x}")


def parse_walk(text):
    """START:END[:TAKEN,...] (hexadecimal, 0x optional) -> (start, end, {taken})."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"--walk wants START:END[:TAKEN,...], got '{text}'")
    try:
        start, end = int(parts[0], 16), int(parts[1], 16)
        taken = {int(t, 16) for t in parts[2].split(",") if t} if len(parts) == 3 else set()
    except ValueError:
        raise ValueError(f"--walk wants hexadecimal addresses, got '{text}'") from None
    return start, end, taken


def loops(kernels, pattern):
    """{kernel: (instructions in the kernel, the loop's instructions or None)} of matching kernels."""
    rx = re.compile(pattern)
    return {name: (len(code), tensor_loops(code)) for name, code in sorted(kernels.items()) if rx.search(name)}


def short_names(mangled):
    """{mangled: readable} through c++filt when there is one: the name up to its parameters,
    without the namespaces (else the mangled name)."""
    names = {m: m for m in mangled}
    tool = shutil.which("c++filt")
    if tool and mangled:
        run = subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True)
        lines = run.stdout.splitlines()
        if run.returncode == 0 and len(lines) == len(mangled):
            for m, d in zip(mangled, lines):
                d = re.sub(r"^void ", "", d)
                depth = 0
                for i, c in enumerate(d):  # cut at the parameter list: the first '(' outside <>
                    depth += c == "<"
                    depth -= c == ">"
                    if c == "(" and depth == 0:
                        d = d[:i]
                        break
                names[m] = re.sub(r"\b(?:mxmoe|cuda|sm90)::", "", d)
    return names


def pairing_key(name):
    """What pairs a kernel with the base's: its readable name without the trailing boolean
    arguments of its innermost template (a tile gaining a defaulted flag stays the same tile)."""
    return re.sub(r"<([^<>]*?)(?:, (?:true|false))+>", r"<\1>", name)


def find_cuobjdump(given):
    for candidate in (given, os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def sass_of(binary, cuobjdump):
    run = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {binary} failed: {run.stderr.strip()[:300]}")
    return run.stdout


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", nargs="?", help="executable or object with sm_90a code")
    ap.add_argument("--base", help="a second binary: print per-opcode differences of each loop against it")
    ap.add_argument("--sass", help="cuobjdump -sass output to read instead of a binary")
    ap.add_argument("--base-sass", help="the base's cuobjdump -sass output")
    ap.add_argument("--kernels", default=r"moe_gemm", help="regular expression on the mangled kernel names")
    ap.add_argument("--cuobjdump", help="path of cuobjdump")
    ap.add_argument("--walk", metavar="START:END[:TAKEN,...]",
                    help="count the instructions issued along one path of the one matching kernel (hex addresses)")
    a = ap.parse_args(argv)
    if bool(a.binary) == bool(a.sass):
        ap.error("name a binary or --sass, not both")
    if a.base and a.base_sass:
        ap.error("name --base or --base-sass, not both")
    if a.walk and (a.base or a.base_sass):
        ap.error("--walk reads one build: leave out --base and --base-sass")
    try:
        walk_range = parse_walk(a.walk) if a.walk else None
    except ValueError as e:
        ap.error(str(e))
    texts = {}
    try:
        if a.binary or a.base:
            tool = find_cuobjdump(a.cuobjdump)
            if tool is None:
                ap.error("cuobjdump not found (--cuobjdump, $CUOBJDUMP, PATH, /usr/local/cuda/bin); where the "
                         "CUDA toolkit lacks it, PyPI's nvidia-cuda-cuobjdump wheel has it: pip download --no-deps "
                         "nvidia-cuda-cuobjdump, unzip, nvidia/cu13/bin/cuobjdump")
        texts["new"] = open(a.sass).read() if a.sass else sass_of(a.binary, tool)
        if a.base or a.base_sass:
            texts["base"] = open(a.base_sass).read() if a.base_sass else sass_of(a.base, tool)
    except (OSError, RuntimeError) as e:
        print(f"sass_loops.py: {e}", file=sys.stderr)
        return 2
    if walk_range:
        rx = re.compile(a.kernels)
        matched = {n: c for n, c in parse_sass(texts["new"]).items() if rx.search(n)}
        if len(matched) != 1:
            print(f"sass_loops.py: --walk needs --kernels to match one kernel; '{a.kernels}' matches {len(matched)}",
                  file=sys.stderr)
            return 1
        (name, code), = matched.items()
        start, end, taken = walk_range
        try:
            path = walk(code, start, end, taken)
        except ValueError as e:
            print(f"sass_loops.py: {e}", file=sys.stderr)
            return 2
        counts = collections.Counter(opcode(ins).split(".")[0] for ins in path)
        print(f"{short_names([name])[name]}: 0x{start:x} .. 0x{end:x}"
              + (f", taken at {', '.join(f'0x{t:x}' for t in sorted(taken))}" if taken else "")
              + f": {len(path)} instructions")
        print("  " + ", ".join(f"{k} {n}" for k, n in counts.most_common()))
        return 0
    new = loops(parse_sass(texts["new"]), a.kernels)
    if not new:
        print(f"sass_loops.py: no kernel matches '{a.kernels}'", file=sys.stderr)
        return 1
    base = loops(parse_sass(texts["base"]), a.kernels) if "base" in texts else {}
    names = short_names(sorted(set(new) | set(base)))
    by_key = {pairing_key(names[m]): m for m in base}
    def sizes(found):  # the innermost loop's size, then the next larger loops' (up to two)
        return f"{len(found[0])}" + (f" [{', '.join(str(len(b)) for b in found[1:3])}]" if len(found) > 1 else "") \
            if found else "-"
    def path(loop):
        estimate = path_estimate(loop) if loop else None
        return f"path {estimate[0]}@{estimate[1]}" if estimate else ""
    for name, (total, found) in new.items():
        loop = found[0] if found else None
        line = f"{sizes(found):>6}  {total:>6}  {names[name]}"
        if path(loop):
            line += f"  {path(loop)}"
        match = by_key.get(pairing_key(names[name]))
        if match is not None:
            btotal, bfound = base[match]
            bloop = bfound[0] if bfound else None
            line = f"{sizes(found):>6} (base {sizes(bfound)})  {total:>6} (base {btotal})  {names[name]}"
            if path(loop) or path(bloop):
                line += f"  {path(loop) or '-'} (base {path(bloop) or '-'})"
            if loop and bloop:
                cn, cb = collections.Counter(map(opcode, loop)), collections.Counter(map(opcode, bloop))
                diff = sorted(((k, cb[k], cn[k]) for k in set(cn) | set(cb) if cn[k] != cb[k]),
                              key=lambda t: -abs(t[2] - t[1]))
                if diff:
                    line += "\n        " + ", ".join(f"{k} {b}->{n}" for k, b, n in diff[:12])
        elif base:
            line += "  (not in the base)"
        print(line)
    print("columns: innermost tensor-core loop [the next larger ones], kernel (SASS instructions), kernel, "
          "path N@W (the loop's instructions at its widest wgmma W, other widths' groups left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
