#!/usr/bin/env bash
# Nsight Compute profiles of MoE forwards on the GPU machine, from binaries built elsewhere: per
# point, the duration of each kernel of one forward (ncu gpu__time_duration.sum, caches flushed
# before each kernel, clocks not locked), and with --full a full profile (--set full, source
# counters) of the kernels matching a pattern in that forward.
#
#   scripts/profile_moe.sh [--bin PATH/bench_moe] [--out DIR] [--full REGEX] SHAPE:T ...
#   scripts/profile_moe.sh qwen3-30b-a3b:2048 kimi-k2:16384
#   scripts/profile_moe.sh --full moe_gemm_prefill kimi-k2:2048
#
# Writes DIR/<shape>_<T>.csv (ncu's CSV), DIR/<shape>_<T>.json (bench/ncu_durations.py: the first
# forward's kernels and µs) and with --full DIR/<shape>_<T>_full.ncu-rep, _full.txt (the details
# page), _full_source.csv (the source page: per SASS instruction, its stall samples) and
# _full_source.json (bench/ncu_source.py: samples by stall reason, by opcode, the top instructions).
# Defaults: bench_moe from ${MXMOE_BIN:-build/bin}, DIR = ${OUT:-.}/profile.
# Exit status: 0 when every point was profiled, 1 when one failed (the rest still run), 2 on a
# usage error.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "profile_moe.sh: $*" >&2; exit 2; }

BENCH=${MXMOE_BIN:-build/bin}/bench_moe
DIR=${OUT:-.}/profile
FULL=""
points=()
while (($#)); do
  case $1 in
    --bin | --out | --full)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in --bin) BENCH=$2 ;; --out) DIR=$2 ;; --full) FULL=$2 ;; esac
      shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *:*)
      shape=${1%%:*} tokens=${1#*:}
      [[ $shape =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "point '$1': expected SHAPE:T with a shape name of bench_moe"
      [[ $tokens =~ ^[1-9][0-9]*$ ]] || die "point '$1': T must be a positive integer"
      points+=("$shape:$tokens")
      shift ;;
    *) die "unknown argument '$1' (expected --bin, --out, --full or SHAPE:T)" ;;
  esac
done
((${#points[@]})) || die "name at least one point SHAPE:T"
[ -x "$BENCH" ] || die "'$BENCH' is not an executable bench_moe (--bin)"
command -v ncu >/dev/null 2>&1 || die "ncu is not on PATH"
mkdir -p "$DIR" || die "cannot create '$DIR'"

# The layer's kernels (a forward launches at most eight: route, schedule, scatter or import, plan,
# gather, two GEMMs, combine); bench_moe's own copy and flush kernels are left out.
LAYER='moe_gemm|gather|combine|route|schedule|plan|scatter|import'
status=0
for pt in "${points[@]}"; do
  shape=${pt%%:*} tokens=${pt#*:} base=$DIR/${pt/:/_}
  echo "profile_moe: $shape T=$tokens"
  # Ten launches: one whole forward and the start of the next (bench/ncu_durations.py cuts there).
  if ! ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum \
      --kernel-name "regex:$LAYER" --launch-count 10 \
      "$BENCH" --shapes "$shape" --tokens "$tokens" --iters 1 >"$base.csv" 2>"$base.err" ||
     ! python3 bench/ncu_durations.py "$base.csv" --json "$base.json"; then
    echo "profile_moe: $shape T=$tokens failed (ncu output: $base.csv, $base.err)" >&2
    status=1
    continue
  fi
  if [ -n "$FULL" ]; then
    if ncu --set full --import-source yes --clock-control none --kernel-name "regex:$FULL" --launch-count 2 \
        -f -o "${base}_full" "$BENCH" --shapes "$shape" --tokens "$tokens" --iters 1 >"${base}_full.log" 2>&1 &&
       ncu --import "${base}_full.ncu-rep" --page details --print-units base >"${base}_full.txt" 2>&1 &&
       ncu --import "${base}_full.ncu-rep" --page source --csv --print-source sass >"${base}_full_source.csv" 2>&1; then
      grep -E "Duration|Registers Per|Issue Slots Busy|DRAM Throughput|Compute \(SM\) Throughput|No Eligible" \
        "${base}_full.txt" | head -12
      python3 bench/ncu_source.py "${base}_full_source.csv" --top 12 --json "${base}_full_source.json" ||
        echo "profile_moe: no stall samples in ${base}_full_source.csv" >&2
    else
      echo "profile_moe: the full profile of $shape T=$tokens failed (${base}_full.log)" >&2
      status=1
    fi
  fi
done
exit $status
