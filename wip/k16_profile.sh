#!/usr/bin/env bash
# The second device call for wip/prefill-k16-pipeline.patch, after wip/k16_call.sh on the same
# carry (.carry/k16: bench_moe, and k16.sh written by k16_call.sh): where K16 moves the time.
# Per kernel durations (ncu, caches flushed) of one forward under the default pipeline and under
# K16, then full profiles (tensor pipe, issue slots, stall samples by SASS instruction) of the
# wide tile's GEMMs at Qwen3-30B-A3B T = 8192 under both. About 4 minutes.
#   bash .carry/k16/k16_profile.sh
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/k16-out}
mkdir -p "$OUT"
[ -x "$B/k16.sh" ] || printf '#!/usr/bin/env bash\nMXMOE_PREFILL_PIPELINE=k16 exec "%s/bench_moe" "$@"\n' "$B" > "$B/k16.sh"
chmod +x "$B/k16.sh"
for v in base k16; do
  bin=$B/bench_moe
  [ $v = k16 ] && bin=$B/k16.sh
  timeout -k 5 100 scripts/profile_moe.sh --bin "$bin" --out "$OUT/profile_$v" qwen3-30b-a3b:2048 qwen3-30b-a3b:8192 \
    gpt-oss-120b:2048 kimi-k2:512
  echo "durations $v rc $?"
  timeout -k 5 60 scripts/profile_moe.sh --bin "$bin" --out "$OUT/full_$v" --full moe_gemm_prefill qwen3-30b-a3b:8192
  echo "full $v rc $?"
done
tar -C "$OUT" -czf "$OUT/profiles.tgz" profile_base profile_k16 full_base full_k16 && rm -rf "$OUT"/profile_* "$OUT"/full_*
