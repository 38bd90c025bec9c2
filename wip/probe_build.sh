#!/usr/bin/env bash
# Builds the binaries of wip/probe_call.sh into .carry/probe (about 8 minutes on 2 cores after
# scripts/setup.sh):
#   bench_moe_tl           main with wip/decode-probe-timeline.patch, all of it compiled with
#                          -DMXMOE_PROBE_TIMELINE in build_tl/ (the patch is reverted afterwards);
#   bench_moe_base         main's bench_moe;
#   bench_moe_p1 .. _p3    main with wip/decode-probe-ladder.patch, gemm_decode.cu compiled with
#                          -DMXMOE_PROBE_DECODE=N (main's object rebuilt at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p .carry/probe
cutlass=$(sed -n 's/^MXMOE_CUTLASS_DIR:PATH=//p' build/CMakeCache.txt)

git apply wip/decode-probe-timeline.patch
trap 'git apply -R wip/decode-probe-timeline.patch' EXIT
cmake -S . -B build_tl -G Ninja -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUTLASS_DIR="$cutlass" \
  -DCMAKE_CUDA_FLAGS=-DMXMOE_PROBE_TIMELINE -DCMAKE_CXX_FLAGS=-DMXMOE_PROBE_TIMELINE > /dev/null
ninja -C build_tl bin/bench_moe > /dev/null
cp build_tl/bin/bench_moe .carry/probe/bench_moe_tl
git apply -R wip/decode-probe-timeline.patch
trap - EXIT

ninja -C build bin/bench_moe > /dev/null
cp build/bin/bench_moe .carry/probe/bench_moe_base
git apply wip/decode-probe-ladder.patch
trap 'git apply -R wip/decode-probe-ladder.patch; ninja -C build > /dev/null' EXIT
CMD=$(python3 -c "
import json
for c in json.load(open('build/compile_commands.json')):
  if c['file'].endswith('moe/gemm_decode.cu'): print(c['command'])
")
for N in 1 2 3; do
  (cd build && eval "${CMD/ -c / -DMXMOE_PROBE_DECODE=$N -c }")
  ninja -C build bin/bench_moe > /dev/null
  cp build/bin/bench_moe .carry/probe/bench_moe_p$N
done
cp wip/probe_call.sh .carry/probe/run.sh
