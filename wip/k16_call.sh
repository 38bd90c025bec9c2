#!/usr/bin/env bash
# The first device call for wip/prefill-k16-pipeline.patch (K16: the prefill consumers' wgmmas
# one k16 step at a time). On this machine, from a tree with the patch applied and built:
#   mkdir -p .carry/k16 && cp build/bin/bench_moe build/bin/mxmoe_gpu_tests wip/k16_call.sh .carry/k16/
# then on the GPU machine (carry .carry/k16): bash .carry/k16/k16_call.sh  (about 9 minutes)
# 1. the prefill GPU tests under MXMOE_PREFILL_PIPELINE=k16 and =k16x8 (every prefill tile then
#    runs the k16 pipeline for weights with scales in [1, 128]);
# 2. the same-run A/B, one binary: base (unset), k16, k16x8, at T = 512 (narrow), 2048 (mid for
#    gpt-oss-120b, narrow for Kimi-K2, wide for Qwen3-30B-A3B) and 8192 (wide);
# 3. memcheck and racecheck of the three prefill tiles under k16.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/k16-out}
mkdir -p "$OUT"
for v in k16 k16x8; do
  printf '#!/usr/bin/env bash\nMXMOE_PREFILL_PIPELINE=%s exec "%s/bench_moe" "$@"\n' "$v" "$B" > "$B/$v.sh"
  chmod +x "$B/$v.sh"
done
nvidia-smi -L
F='GpuMoePrefill.*:GpuMoePrefillRouting.*:GpuMoePrefillGraph.*:GpuMoePrefillSanitize.*'
for v in k16 k16x8; do
  MXMOE_PREFILL_PIPELINE=$v timeout -k 5 120 "$B/mxmoe_gpu_tests" --gtest_filter="$F" > "$OUT/t_$v.txt" 2>&1
  echo "tests $v rc $?"
  grep -E '^\[ *(FAILED|PASSED|SKIPPED) |Failure' "$OUT/t_$v.txt" | head -12
done
scripts/ab_moe.sh --rounds 2 --shapes gpt-oss-120b,qwen3-30b-a3b,kimi-k2 --tokens 512,2048,8192 --iters 10 \
  --time-limit 220 --out "$OUT/ab" base="$B/bench_moe" k16="$B/k16.sh" k16x8="$B/k16x8.sh" > "$OUT/ab.log" 2>&1
echo "ab rc $?"
tail -30 "$OUT/ab/ab.txt"
for tool in memcheck racecheck; do
  MXMOE_PREFILL_PIPELINE=k16 timeout -k 5 80 compute-sanitizer --tool $tool --error-exitcode 3 "$B/mxmoe_gpu_tests" \
    --gtest_filter='GpuMoePrefillSanitize.*' > "$OUT/san_$tool.txt" 2>&1
  echo "$tool rc $?"
  tail -4 "$OUT/san_$tool.txt"
done
