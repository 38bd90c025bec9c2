# cuda-gdb script for wip/sc_hang_cuda_gdb.sh: the kernels, the SMs with warps, the warps (PCs) of
# the first 12 of them, and for the first 4 the instruction at each warp's PC and the block's
# shared words around the mbarriers (from MXMOE_BAR_ADDR, default the converted tile's BAR_OFFSET,
# 180 words: the barriers start BAR_OFFSET past the 1024-aligned base, which follows the kernel's
# 1 KB of static shared memory).
import os
import gdb

BAR_ADDR = int(os.environ.get("MXMOE_BAR_ADDR", "222208"))
BAR_WORDS = int(os.environ.get("MXMOE_BAR_WORDS", "180"))


def run(cmd):
    try:
        return gdb.execute(cmd, to_string=True)
    except Exception as e:  # a command cuda-gdb refuses must not end the dump
        return "%s: %s\n" % (cmd, e)


print(run("info cuda kernels"))
out = run("info cuda sms")
print(out)
sms = []
for line in out.splitlines():
    t = line.replace('*', ' ').split()
    if t and t[0].isdigit():
        sms.append(int(t[0]))
for n, sm in enumerate(sms[:12]):
    warps = run("info cuda warps sm %d" % sm)
    print(warps)
    if n >= 4:
        continue
    for line in warps.splitlines():
        t = line.replace('*', ' ').split()
        if not (t and t[0].isdigit()):
            continue
        w = int(t[0])
        r = run("cuda sm %d warp %d lane 0" % (sm, w))
        if "error" in r.lower() or "cannot" in r.lower():
            continue
        print("sm %d warp %d: %s" % (sm, w, run("x/3i $pc").strip().replace("\n", " | ")))
    print("sm %d barriers:" % sm)
    print(run("x/%dgx (@shared unsigned long long *)%d" % (BAR_WORDS, BAR_ADDR)))
