#!/usr/bin/env bash
# Build (via setup.sh) and run every test through ctest. GPU tests report "skipped" with the
# reason on a machine without an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${MXMOE_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
