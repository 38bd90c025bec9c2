#!/usr/bin/env bash
# Starts P processes of one command on this host, one GPU each, as the ranks of one NCCL group
# (include/mxmoe/parallel.h nccl_from_environment; docs/parallel.md).
#
#   scripts/launch.sh -n P [--] COMMAND [ARGS...]
#   scripts/launch.sh -n 2 -- build/bin/mxmoe run --preset gpt-oss-120b --tokens 64 --device cuda --ep 2
#
# Process r gets RANK = NODE * P + r, LOCAL_RANK = r, WORLD_SIZE = NODES * P, LOCAL_WORLD_SIZE = P,
# CUDA_VISIBLE_DEVICES = the r-th entry of MXMOE_GPUS (default 0,1,..,P-1), MXMOE_NCCL_ID_FILE (rank 0
# writes NCCL's unique id there, the others wait for it) and NCCL_NVLS_ENABLE=0 (never NVLink
# multicast). Its output lines are prefixed "[rank R] ".
#
# One host: the id file lives in a fresh temporary folder, removed at the end.
# Several hosts: run the same line on every host with MXMOE_NNODES (hosts), MXMOE_NODE_RANK (this
# host, 0 ..) and MXMOE_NCCL_ID_FILE naming a new path on storage every host sees (a new path per
# job: a stale id would join the wrong group); NCCL's own variables (NCCL_SOCKET_IFNAME,
# NCCL_IB_HCA, ...) pass through unchanged.
#
# Exit status: 0 when every rank exits 0, else the first failing rank's. When a rank fails, the
# others (which may be waiting for it inside NCCL) are stopped after MXMOE_LAUNCH_GRACE seconds
# (default 30).
set -uo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "launch.sh: $*" >&2; exit 2; }

P=""
while (($#)); do
  case $1 in
    -n) [ $# -ge 2 ] || die "-n needs a value"; P=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ $P =~ ^[1-9][0-9]*$ ]] || die "-n P: a positive process count is required (got '${P}')"
(($#)) || die "no command to launch"

NODES=${MXMOE_NNODES:-1}
NODE=${MXMOE_NODE_RANK:-0}
GRACE=${MXMOE_LAUNCH_GRACE:-30}
[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "MXMOE_NNODES: a positive integer (got '$NODES')"
[[ $NODE =~ ^[0-9]+$ ]] && ((NODE < NODES)) || die "MXMOE_NODE_RANK: an integer in [0, $NODES) (got '$NODE')"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ((NODES > 1)); then
  [ -n "${MXMOE_NCCL_ID_FILE:-}" ] || die "MXMOE_NCCL_ID_FILE: a new path on storage all $NODES hosts see"
  ID_FILE=$MXMOE_NCCL_ID_FILE
else
  ID_FILE=${MXMOE_NCCL_ID_FILE:-$tmp/nccl_id}
fi
if ((NODE == 0)) && [ -e "$ID_FILE" ]; then
  die "$ID_FILE exists: a stale NCCL id would join another group; give a new path"
fi

IFS=, read -r -a GPUS <<<"${MXMOE_GPUS:-$(seq -s, 0 $((P - 1)))}"
((${#GPUS[@]} >= P)) || die "MXMOE_GPUS lists ${#GPUS[@]} GPUs for $P processes"

# Job control: every rank runs in a process group of its own, so that stopping a rank stops what
# it started too (and an interrupt of this script stops every rank).
set -m
pids=()     # the ranks' processes (each one its process group's leader)
filters=()  # their output prefixers, each reading one rank's FIFO
for ((r = 0; r < P; ++r)); do
  rank=$((NODE * P + r))
  mkfifo "$tmp/out$r"
  sed -u "s/^/[rank $rank] /" <"$tmp/out$r" &
  filters+=($!)
  (
    export RANK=$rank LOCAL_RANK=$r WORLD_SIZE=$((NODES * P)) LOCAL_WORLD_SIZE=$P
    export CUDA_VISIBLE_DEVICES=${GPUS[$r]} MXMOE_NCCL_ID_FILE=$ID_FILE NCCL_NVLS_ENABLE=0
    exec "$@"
  ) >"$tmp/out$r" 2>&1 &
  pids+=($!)
done

stop_all() {
  for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null; done
}
trap 'stop_all; exit 130' INT TERM

status=0
failed_at=0
declare -A finished
while :; do
  running=0
  for r in "${!pids[@]}"; do
    [ -n "${finished[$r]:-}" ] && continue
    pid=${pids[$r]}
    if kill -0 "$pid" 2>/dev/null; then
      running=$((running + 1))
      continue
    fi
    wait "$pid"
    rc=$?
    finished[$r]=$rc
    if ((rc != 0 && status == 0)); then
      status=$rc
      failed_at=$SECONDS
      echo "launch.sh: rank $((NODE * P + r)) exited with $rc" >&2
    fi
  done
  ((running == 0)) && break
  if ((status != 0 && SECONDS - failed_at >= GRACE)); then
    for r in "${!pids[@]}"; do
      [ -n "${finished[$r]:-}" ] || { echo "launch.sh: stopping rank $((NODE * P + r)) (pid ${pids[$r]})" >&2; kill -- -"${pids[$r]}" 2>/dev/null; }
    done
    GRACE=1000000000  # once
  fi
  sleep 0.2
done
wait "${filters[@]}"
exit $status
