# cuda-gdb script for wip/sc_hang_cuda_gdb.sh: the kernels, the SMs with warps, and the warps (PCs) of the first 12 of them.
import gdb
gdb.execute("info cuda kernels")
out = gdb.execute("info cuda sms", to_string=True)
print(out)
sms = []
for line in out.splitlines():
    t = line.replace('*', ' ').split()
    if t and t[0].isdigit():
        sms.append(int(t[0]))
for sm in sms[:12]:
    try:
        gdb.execute("info cuda warps sm %d" % sm)
    except Exception as e:
        print("sm", sm, e)
