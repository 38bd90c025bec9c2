#!/usr/bin/env bash
# Build (via setup.sh) and run every test: the C++ tests through ctest, then the Python tests
# (python/tests, pytest) with the pinned torch and transformers of python/requirements-test.txt
# (the package is built again once torch is there, for its C++ torch op library).
# GPU tests report "skipped" on a machine without an sm_90 GPU; after ctest's summary one line per
# reason says which tests were skipped and why (scripts/ctest_skips.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${MXMOE_BUILD_DIR:-build}"
ctest_rc=0
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@" || ctest_rc=$?
scripts/ctest_skips.sh "$build" || true
[ "$ctest_rc" -eq 0 ] || exit "$ctest_rc"

. scripts/python_env.sh
"$MXMOE_PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore -r python/requirements-test.txt
# The package's C++ torch op library (libmxmoe_torch.so) is built only where torch is importable at
# build time; on a fresh machine torch arrives just above, after setup.sh built the package: build
# the package again (only that library compiles). The tests fail when it is missing.
if ! "$MXMOE_PYTHON" -c 'import sys, mxmoe._lib as l, mxmoe._torchop as t
sys.exit(not l.library_path.with_name(t.LIBRARY_FILE).is_file())'; then
  echo "test: torch is installed now: building the package again for its C++ torch op library"
  scripts/setup.sh
fi
rc=0
"$MXMOE_PYTHON" -m pytest python/tests -q -rs -p no:cacheprovider || rc=$?
if [ "$rc" -eq 5 ]; then echo "test: pytest collected no Python tests" >&2; exit 1; fi
exit "$rc"
