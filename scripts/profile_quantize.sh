#!/usr/bin/env bash
# Nsight Compute profiles of the GPU quantize kernels (bf16 input, 256 MiB, linear scales) and the
# fixed cost per call (bench_quantize at 1 MiB), on the GPU machine, from binaries built elsewhere.
# Writes to $OUT (default ./gpu-out): profile_<rule>.txt (ncu details, clocks not locked) and
# fixed_cost.txt. Usage: MXMOE_BIN=build/bin scripts/profile_quantize.sh [rule ...] (default: floor rceil mse)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BIN=${MXMOE_BIN:-build/bin}
mkdir -p "$OUT"
# bench_quantize --sizes 256 --iters 20 launches quantize_fast 46 times per rule (3 warm-up + 20
# timed one by one, 3 + 20 back to back), in the order floor, even, rceil, mse with statistics, the
# same without, then rceil with tiled scales. The profiles are of the kernels with statistics.
declare -A skip=([floor]=0 [even]=46 [rceil]=92 [mse]=138)
rules=("$@")
[ ${#rules[@]} -gt 0 ] || rules=(floor rceil mse)
for r in "${rules[@]}"; do
  if [ -z "${skip[$r]+set}" ]; then
    echo "unknown rule '$r': expected floor, even, rceil or mse" >&2
    exit 2
  fi
done
"$BIN/bench_quantize" --sizes 1,256 --iters 20 2>&1 | tee "$OUT/fixed_cost.txt"
for r in "${rules[@]}"; do
  timeout 240 ncu --set full --clock-control none --kernel-name regex:quantize_fast --launch-skip "${skip[$r]}" \
    --launch-count 1 --page details --print-units base "$BIN/bench_quantize" --sizes 256 --iters 20 \
    >"$OUT/profile_$r.txt" 2>&1
  echo "ncu $r: exit $?"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|DRAM Throughput|No Eligible" "$OUT/profile_$r.txt" | head -12
done
# finalize_stats runs once per quantize call: skip the first rule's warm-up and most of its timed runs.
timeout 120 ncu --set full --clock-control none --kernel-name regex:finalize_stats --launch-skip 30 --launch-count 1 \
  --page details --print-units base "$BIN/bench_quantize" --sizes 256 --iters 20 >"$OUT/profile_finalize.txt" 2>&1
echo "ncu finalize: exit $?"
grep -E "Duration" "$OUT/profile_finalize.txt" | head -3
