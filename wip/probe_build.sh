#!/usr/bin/env bash
# Builds the probe ladder's binaries for wip/probe_call.sh into .carry/probe (about 2 minutes after
# scripts/setup.sh): main's bench_moe as base, then p1-p3 with wip/decode-probe-ladder.patch and
# -DMXMOE_PROBE_DECODE=N on gemm_decode.cu only; the patch is reverted and main's object rebuilt at
# the end, so that build/ holds main again.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p .carry/probe
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
