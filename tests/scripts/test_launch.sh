#!/usr/bin/env bash
# Tests of scripts/launch.sh with plain shell commands (no GPU, no NCCL): the environment each rank
# gets, the exit status, the stopping of the other ranks when one fails, and bad usage.
set -u
cd "$(dirname "$0")/../.."
L=scripts/launch.sh
fail=0
check() {  # check NAME EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then echo "FAIL $1: expected [$2], got [$3]"; fail=1; else echo "ok   $1"; fi
}

out=$($L -n 3 -- sh -c 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $CUDA_VISIBLE_DEVICES $NCCL_NVLS_ENABLE $(basename "$MXMOE_NCCL_ID_FILE")"' | sort)
check "environment of each rank" "[rank 0] 0 0 3 0 0 nccl_id
[rank 1] 1 1 3 1 0 nccl_id
[rank 2] 2 2 3 2 0 nccl_id" "$out"

out=$(MXMOE_GPUS=4,6 $L -n 2 sh -c 'echo $CUDA_VISIBLE_DEVICES' | sort)
check "MXMOE_GPUS picks the GPUs" "[rank 0] 4
[rank 1] 6" "$out"

out=$(MXMOE_NNODES=2 MXMOE_NODE_RANK=1 MXMOE_NCCL_ID_FILE=/nonexistent/shared/id $L -n 2 sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK' | sort)
check "second host's ranks" "[rank 2] 2 4 0
[rank 3] 3 4 1" "$out"

SECONDS=0
MXMOE_LAUNCH_GRACE=1 $L -n 3 -- sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60' >/dev/null 2>&1
rc=$?
check "a failing rank's status" 3 "$rc"
check "the others are stopped after the grace period" yes "$([ $SECONDS -lt 20 ] && echo yes || echo no)"

$L -n 0 true >/dev/null 2>&1; check "-n 0 is bad usage" 2 "$?"
$L -n 2 >/dev/null 2>&1; check "no command is bad usage" 2 "$?"
MXMOE_NNODES=2 $L -n 2 true >/dev/null 2>&1; check "several hosts need a shared id file" 2 "$?"
exit $fail
