#!/usr/bin/env bash
# Build (via setup.sh) and run every test: the C++ tests through ctest, then the Python tests
# (python/tests, pytest) with the pinned torch and transformers of python/requirements-test.txt.
# GPU tests report "skipped" with the reason on a machine without an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${MXMOE_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"

. scripts/python_env.sh
"$MXMOE_PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore -r python/requirements-test.txt
rc=0
"$MXMOE_PYTHON" -m pytest python/tests -q -rs -p no:cacheprovider || rc=$?
if [ "$rc" -eq 5 ]; then echo "test: pytest collected no Python tests" >&2; exit 1; fi
exit "$rc"
