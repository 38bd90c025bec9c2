#!/usr/bin/env bash
# scripts/ctest_skips.sh on a ctest log: each reason once, with the count and the first names of
# the tests it skipped; passing tests and tests without a reason line are not listed.
set -u
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/Testing/Temporary"
{
  for i in 1 2 3 4 5; do
    printf '%s/7 Testing: Gpu.Case%s\n%s/7 Test: Gpu.Case%s\nOutput:\n----\nSKIPPED: GPU tests need an sm_90 GPU: no CUDA device\n<end of output>\nTest Passed.\n' "$i" "$i" "$i" "$i"
  done
  printf '6/7 Test: Cli.Demo\nOutput:\n----\n[  PASSED  ] 1 test.\n<end of output>\nTest Passed.\n'
  printf '7/7 Test: peer_interpret\nOutput:\n----\nSKIPPED: No module named torch\n<end of output>\n'
} > "$dir/Testing/Temporary/LastTest.log"
out=$(scripts/ctest_skips.sh "$dir")
expected="skipped: 5 tests (Gpu.Case1, Gpu.Case2, Gpu.Case3, ... 2 more): GPU tests need an sm_90 GPU: no CUDA device
skipped: 1 test (peer_interpret): No module named torch"
if [ "$out" != "$expected" ]; then
  printf 'FAIL: expected\n%s\ngot\n%s\n' "$expected" "$out"
  exit 1
fi
scripts/ctest_skips.sh "$dir/none" 2>/dev/null && { echo "FAIL: a missing log is not an error"; exit 1; }
echo ok
