#!/usr/bin/env bash
# A first device call for issue 10's T = 1 points (~3 minutes): what any read of a decode step's
# weight bytes costs, next to what the layer's decode GEMMs take for the same bytes on the same GPU.
# On this machine, from a build of main (scripts/setup.sh):
#   mkdir -p .carry/t1 && cp build/bin/bench_stream_read build/bin/bench_moe wip/t1_call.sh .carry/t1/
# then on the GPU machine (carry .carry/t1): bash .carry/t1/t1_call.sh
# 1. bench_stream_read: each preset's T = 1 GEMM1 / GEMM2 / both bytes, read after an L2 flush
#    (span and event time, best grid; full rows in stream_read.json);
# 2. ncu durations of one forward at T = 1 on gpt-oss-120b, Qwen3-30B-A3B and Kimi-K2 (ncu flushes
#    the caches before each kernel, as bench_stream_read's clean flush does);
# 3. a full profile (source counters) of gpt-oss-120b's decode GEMMs at T = 1.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/t1-out}
mkdir -p "$OUT"
nvidia-smi -L
timeout 90 "$B/bench_stream_read" --json "$OUT/stream_read.json" | tee "$OUT/stream_read.txt"
echo "stream_read rc ${PIPESTATUS[0]}"
MXMOE_BIN=$B timeout 150 scripts/profile_moe.sh --out "$OUT/profile" gpt-oss-120b:1 qwen3-30b-a3b:1 kimi-k2:1 2>&1 |
  grep -vE '^==|^"' | tail -30
MXMOE_BIN=$B timeout 150 scripts/profile_moe.sh --out "$OUT/full" --full moe_gemm_decode gpt-oss-120b:1 2>&1 |
  grep -vE '^==|^"' | tail -40
tar czf "$OUT/profiles.tgz" -C "$OUT" profile full && rm -rf "$OUT/profile" "$OUT/full"
