#!/usr/bin/env bash
# Fetches the benchmark's peer: triton_kernels as vLLM 0.33.0 ships it (vllm/third_party/triton_kernels,
# the kernels behind vLLM's default MXFP4 MoE path on Hopper). Downloads the vllm wheel from PyPI
# (no dependencies, ~336 MB) into a temporary folder, extracts only that package into
# .peer/triton_kernels (git-ignored, never committed), checks it, deletes the wheel.
# Idempotent: does nothing when .peer/ already holds the same version.
#   scripts/fetch_peer.sh            then: PYTHONPATH=.peer python3 bench/peer_triton.py ...
#   MXMOE_PEER_DIR=path              extract elsewhere (default .peer)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.33.0
DEST=${MXMOE_PEER_DIR:-.peer}
PKG=vllm/third_party/triton_kernels
STAMP="$DEST/VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "vllm==$VERSION" ] && [ -f "$DEST/triton_kernels/matmul_ogs.py" ]; then
  echo "fetch_peer: $DEST/triton_kernels already holds the copy from vllm==$VERSION; nothing to do"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_peer: downloading vllm==$VERSION (wheel only, no dependencies) into $tmp"
# The wheel is abi3 for every CPython >= 3.8; naming the platform lets any host Python fetch it.
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
  --python-version 3.12 --implementation cp -d "$tmp" "vllm==$VERSION"
wheel=$(ls "$tmp"/vllm-"$VERSION"-*.whl)
echo "fetch_peer: extracting $PKG from $(basename "$wheel") ($(du -m "$wheel" | cut -f1) MB)"
python3 - "$wheel" "$PKG" "$tmp/x" <<'EOF'
import sys, zipfile
wheel, pkg, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(pkg + "/")]
    if not names:
        sys.exit(f"fetch_peer: {pkg} is not in {wheel}")
    z.extractall(out, names)
print(f"fetch_peer: {len(names)} files")
EOF
for f in __init__.py matmul_ogs.py routing.py numerics_details/mxfp.py tensor_details/layout.py; do
  [ -f "$tmp/x/$PKG/$f" ] || { echo "fetch_peer: $PKG/$f missing from the wheel" >&2; exit 1; }
done
# The package imports itself as the top-level `triton_kernels` (absolute imports), so it must sit
# directly under a PYTHONPATH entry.
mkdir -p "$DEST"
rm -rf "$DEST/triton_kernels.new"
mv "$tmp/x/$PKG" "$DEST/triton_kernels.new"
rm -rf "$DEST/triton_kernels"
mv "$DEST/triton_kernels.new" "$DEST/triton_kernels"
echo "vllm==$VERSION" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
# Every file must at least parse (a truncated extraction fails here, not on the GPU machine).
python3 -c "import ast, pathlib, sys; [ast.parse(p.read_text(), str(p)) for p in pathlib.Path(sys.argv[1]).rglob('*.py')]" \
  "$DEST/triton_kernels"
echo "fetch_peer: $DEST/triton_kernels ready ($(du -sk "$DEST/triton_kernels" | cut -f1) KB, $(find "$DEST/triton_kernels" -name '*.py' | wc -l) Python files, vllm==$VERSION)"
