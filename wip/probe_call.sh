#!/usr/bin/env bash
# The decode probe ladder (built in the fortieth session, not run: the device budget ran out).
# Three probe builds of the decode GEMM (wip/decode-probe-ladder.patch; results wrong on purpose):
#   p1 = the ring without the conversion and the mma; p2 = p1 without the per-stage CTA barrier;
#   p3 = the full kernel without the per-stage CTA barrier.
# On this machine, from a build of main (scripts/setup.sh), with the patch applied for p1-p3:
#   mkdir -p .carry/probe && cp build/bin/bench_moe .carry/probe/bench_moe_base
#   for N in 1 2 3: compile src/cuda/moe/gemm_decode.cu as in build/compile_commands.json plus
#     -DMXMOE_PROBE_DECODE=N, `ninja -C build bin/bench_moe`, cp build/bin/bench_moe .carry/probe/bench_moe_pN
#   (then rebuild gemm_decode.cu without the define before anything else); cp wip/probe_call.sh .carry/probe/run.sh
# And the timeline build (wip/decode-probe-timeline.patch: main's kernels stamping each CTA's start,
# wait and end; a full build with -DMXMOE_PROBE_TIMELINE, see wip/README.md) as bench_moe_tl.
# On the GPU machine (carry .carry/probe, ~60 MB): bash .carry/probe/run.sh   (~5 minutes)
# 1. the timeline of one graph replay per point (gpt-oss-120b, Qwen3-30B-A3B, Kimi-K2 at T = 1, 8,
#    32, 128; dirty and clean flush), printed and in $OUT/timeline_*.jsonl;
# 2. ncu durations of one forward per ladder build (gpt-oss-120b T = 1, Kimi-K2 T = 1, Qwen3-30B-A3B T = 128);
# 3. the layer by ab_moe.sh (three shapes, T = 1, 8, 128, two rounds).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/probe-out}
mkdir -p "$OUT"
nvidia-smi -L
if [ -x "$B/bench_moe_tl" ]; then
  for f in dirty clean; do
    MXMOE_PROBE_TIMELINE_JSON=$OUT/timeline_$f.jsonl timeout 90 "$B/bench_moe_tl" --shapes gpt-oss-120b,qwen3-30b-a3b,kimi-k2 \
      --tokens 1,8,32,128 --iters 10 --l2-flush $f 2>&1 | grep -E "^timeline|^  [a-z]" | sed "s/^/[$f] /"
  done
fi
for b in p1 p2 p3 base; do
  mkdir -p "$B/$b" && cp "$B/bench_moe_$b" "$B/$b/bench_moe"
  MXMOE_BIN=$B/$b timeout 60 scripts/profile_moe.sh --out "$OUT/profile_$b" gpt-oss-120b:1 kimi-k2:1 qwen3-30b-a3b:128 2>&1 |
    grep -vE '^==|^"' | grep -E "profile_moe|decode|plan|combine|sum" | sed "s/^/[$b] /"
done
tar czf "$OUT/profiles.tgz" -C "$OUT" $(cd "$OUT" && ls -d profile_*) && rm -rf "$OUT"/profile_*
timeout 200 scripts/ab_moe.sh --rounds 2 --shapes gpt-oss-120b,qwen3-30b-a3b,kimi-k2 --tokens 1,8,128 --iters 10 \
  --time-limit 150 --out "$OUT/ab" base=$B/base/bench_moe p1=$B/p1/bench_moe p2=$B/p2/bench_moe p3=$B/p3/bench_moe 2>&1 | tail -20
