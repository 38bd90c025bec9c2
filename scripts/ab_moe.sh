#!/usr/bin/env bash
# Same-run A/B of MoE layer builds on the GPU machine: each build's bench_moe runs once per round,
# the builds alternating within a round and each round starting one build further along the list
# (no build always runs first, on a GPU still cool), then bench/ab_compare.py prints every build's
# best round over the base build's best round, with each build's own round spread, marking ratios
# beyond the run's largest spread (docs/performance.md, "How to reproduce").
#
#   scripts/ab_moe.sh [--rounds R] [--shapes a,b] [--tokens 1,8,...] [--iters N] [--out DIR] \
#                     [--time-limit S] [--l2-flush dirty|clean] base=PATH/bench_moe NAME=PATH/bench_moe ...
#   scripts/ab_moe.sh --tokens 1,8,32 base=old/bin/bench_moe new=build/bin/bench_moe
#
# The first build named is the base. Writes DIR/<build>_<round>.json (bench_moe --json),
# DIR/ab.json (the comparison), DIR/ab.txt (the table printed last), DIR/runs.txt (each run's start
# and end) and, where nvidia-smi is found, DIR/clocks.csv (SM clock and power every 100 ms; the
# table then ends with each run's median and lowest SM clock and highest power). Defaults: 2
# rounds, the six shapes of docs/models.md, T = 1,2,4,8,16,32,64,128, 20 iterations,
# DIR = ${OUT:-.}/ab. --time-limit S: no run starts once S seconds have passed; the comparison
# then covers the rounds done (it says so on stderr), so that a device call with a hard limit
# still gets its table (one that ran past its limit before comparing lost everything:
# docs/performance.md, twenty-second session).
# --l2-flush: bench_moe's flush before each timed replay (default: bench_moe's, dirty).
# Environment variables such as MXMOE_MOE_PATH apply to every build alike.
# Exit status: 0 when every run wrote its results, 1 when one failed (the table then covers the
# rest), 2 on a usage error.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "ab_moe.sh: $*" >&2; exit 2; }

ROUNDS=2
SHAPES=gpt-oss-120b,qwen3-30b-a3b,kimi-k2,gpt-oss-20b,deepseek-v3,deepseek-v4-flash-like
TOKENS=1,2,4,8,16,32,64,128
ITERS=20
LIMIT=""
FLUSH=()
DIR=${OUT:-.}/ab
names=()
bins=()
while (($#)); do
  case $1 in
    --rounds | --shapes | --tokens | --iters | --out | --time-limit | --l2-flush)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in
        --rounds) ROUNDS=$2 ;; --shapes) SHAPES=$2 ;; --tokens) TOKENS=$2 ;; --iters) ITERS=$2 ;; --out) DIR=$2 ;;
        --time-limit) LIMIT=$2 ;;
        --l2-flush) [[ $2 == dirty || $2 == clean ]] || die "--l2-flush: expected dirty or clean, got '$2'"
                    FLUSH=(--l2-flush "$2") ;;
      esac
      shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *=*)
      name=${1%%=*} bin=${1#*=}
      [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]] || die "build name '$name': letters, digits, '.' and '-' only"
      for n in "${names[@]}"; do [ "$n" != "$name" ] || die "build name '$name' given twice"; done
      [ -x "$bin" ] || die "build '$name': '$bin' is not an executable bench_moe"
      names+=("$name") bins+=("$bin")
      shift ;;
    *) die "unknown argument '$1' (expected --rounds, --shapes, --tokens, --iters, --out, --time-limit, --l2-flush or NAME=PATH)" ;;
  esac
done
((${#names[@]} >= 2)) || die "name at least two builds: base=PATH NAME=PATH ..."
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds: expected a positive integer, got '$ROUNDS'"
[[ $ITERS =~ ^[1-9][0-9]*$ ]] || die "--iters: expected a positive integer, got '$ITERS'"
[ -z "$LIMIT" ] || [[ $LIMIT =~ ^[1-9][0-9]*$ ]] || die "--time-limit: expected a positive number of seconds, got '$LIMIT'"

mkdir -p "$DIR" || die "cannot create '$DIR'"
# The SM clock and power every 100 ms while the builds run, and when each run started and ended:
# a build that loses only in the captured layer may be running at a lower clock (power cap).
rm -f "$DIR/clocks.csv" "$DIR/runs.txt"
SMI_PID=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 \
    >"$DIR/clocks.csv" 2>/dev/null &
  SMI_PID=$!
  trap '[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null' EXIT
else
  echo "ab_moe: nvidia-smi not found: the SM clock is not sampled" >&2
fi
status=0
start_us=${EPOCHREALTIME/./}
n=${#names[@]}
for ((r = 1; r <= ROUNDS; ++r)); do
  for ((j = 0; j < n; ++j)); do
    i=$(((j + r - 1) % n))
    if [ -n "$LIMIT" ] && ((${EPOCHREALTIME/./} - start_us >= LIMIT * 1000000)); then
      echo "ab_moe: --time-limit $LIMIT s reached in round $r: no more runs; comparing the runs done" >&2
      break 2
    fi
    json=$DIR/${names[$i]}_$r.json
    echo "ab_moe: round $r, ${names[$i]}"
    t0=$(date +%s.%N)
    if ! "${bins[$i]}" --shapes "$SHAPES" --tokens "$TOKENS" --iters "$ITERS" "${FLUSH[@]}" --json "$json" >"$DIR/${names[$i]}_$r.log" 2>&1; then
      echo "ab_moe: ${names[$i]} failed in round $r (log: $DIR/${names[$i]}_$r.log)" >&2
      rm -f "$json"
      status=1
    fi
    echo "${names[$i]} $r $t0 $(date +%s.%N)" >>"$DIR/runs.txt"
  done
done
if [ -n "$SMI_PID" ]; then
  kill "$SMI_PID" 2>/dev/null
  wait "$SMI_PID" 2>/dev/null
  SMI_PID=""
fi
builds=$(IFS=,; echo "${names[*]}")
python3 bench/ab_compare.py "$DIR" --base "${names[0]}" --builds "$builds" --json "$DIR/ab.json" | tee "$DIR/ab.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
