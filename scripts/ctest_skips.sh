#!/usr/bin/env bash
# Prints the tests of the last ctest run in BUILD_DIR (default build) that were skipped, with the
# reason each printed (a line "SKIPPED: reason": the GPU tests without an sm_90 GPU, the peer
# check without torch/triton), one line per reason: ctest itself only says "Skipped".
# Reads BUILD_DIR/Testing/Temporary/LastTest.log; prints nothing when nothing was skipped.
set -euo pipefail
log="${1:-build}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || { echo "ctest_skips: no $log (run ctest first)" >&2; exit 2; }
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3 }
  /^SKIPPED: / && name != "" {
    reason = substr($0, 10)
    if (!(reason in count)) order[++n] = reason
    count[reason]++
    if (count[reason] <= 3) names[reason] = names[reason] (count[reason] > 1 ? ", " : "") name
    name = ""
  }
  END {
    for (i = 1; i <= n; ++i) {
      r = order[i]
      more = count[r] > 3 ? sprintf(", ... %d more", count[r] - 3) : ""
      printf "skipped: %d test%s (%s%s): %s\n", count[r], count[r] == 1 ? "" : "s", names[r], more, r
    }
  }' "$log"
