#!/usr/bin/env bash
# The next step on prefill-wide-converter.patch's hang: run its first hanging GPU test under
# cuda-gdb, interrupt it once the kernel hangs, and print every stuck warp's PC (match the PCs
# with `cuobjdump -sass` of the same binary). Run on the GPU machine from the repository root,
# with the patch applied and built: wip/sc_hang_cuda_gdb.sh [path/to/mxmoe_gpu_tests]
BIN=${1:-build/bin/mxmoe_gpu_tests}
timeout -s INT -k 90 25 cuda-gdb -batch -ex "set pagination off" -ex "set cuda break_on_launch none" -ex run \
  -ex "source $(dirname "$0")/sc_hang_warps.py" \
  --args "$BIN" --gtest_filter=GpuMoePrefillSanitize.WideConverterWarps 2>&1 | grep -v '^\[New Thread\|^\[Thread'
