#!/usr/bin/env bash
# Set up and build mxmoe on a fresh Debian/Ubuntu machine. Idempotent: a second run only
# rebuilds what changed.
#   1. Debian packages (only those missing): compiler, CMake, Ninja, the Python headers (for the
#      package's extension module), GoogleTest, CLI11,
#      nlohmann-json, fmt.
#   2. CUTLASS/CuTe headers from the PyPI nvidia-cutlass wheel (pinned) into .deps/cutlass,
#      unless MXMOE_CUTLASS_DIR points at a CUTLASS checkout already. Only with nvcc present.
#   3. Configure and build into ${MXMOE_BUILD_DIR:-build} (CUDA backend when nvcc is found).
#   4. Install the Python package (python/, `import mxmoe`) from that same build directory, so
#      nothing is compiled twice (scripts/python_env.sh picks the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_VERSION=4.2.0.0
SKBUILD_CORE_VERSION=1.1.2
BUILD_DIR=${MXMOE_BUILD_DIR:-build}
PKGS=(g++ cmake ninja-build python3 python3-pip python3-dev unzip libgtest-dev libcli11-dev nlohmann-json3-dev libfmt-dev)

missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
cutlass_define=""
if command -v nvcc >/dev/null 2>&1; then
  if [ -n "${MXMOE_CUTLASS_DIR:-}" ]; then
    cutlass_define=$MXMOE_CUTLASS_DIR
  else
    dest=.deps/cutlass
    if [ "$(cat "$dest/VERSION" 2>/dev/null)" != "$CUTLASS_VERSION" ]; then
      echo "setup: fetching CUTLASS $CUTLASS_VERSION headers (PyPI nvidia-cutlass)"
      tmp=$(mktemp -d)
      python3 -m pip download -q --no-deps "nvidia-cutlass==$CUTLASS_VERSION" -d "$tmp"
      rm -rf "$dest" && mkdir -p "$dest/tools/util"
      (cd "$tmp" && unzip -q nvidia_cutlass-*.whl 'cutlass_library/source/include/*' \
        'cutlass_library/source/tools/util/include/*')
      mv "$tmp/cutlass_library/source/include" "$dest/include"
      mv "$tmp/cutlass_library/source/tools/util/include" "$dest/tools/util/include"
      echo "$CUTLASS_VERSION" >"$dest/VERSION"
      rm -rf "$tmp"
    fi
    cutlass_define=$PWD/$dest
  fi
  cmake_args+=("-DMXMOE_CUTLASS_DIR=$cutlass_define")
else
  echo "setup: no nvcc found: building the CPU backend only"
fi

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" "${cmake_args[@]}" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "${MXMOE_JOBS:-$(nproc)}"
echo "setup: built into $BUILD_DIR"

# Without build isolation: scikit-build-core clears a build directory's CMake cache when it runs
# from a different (temporary, isolated) environment than last time.
. scripts/python_env.sh
"$MXMOE_PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore "scikit-build-core==$SKBUILD_CORE_VERSION"
"$MXMOE_PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-build-isolation ./python \
  -C build-dir="$PWD/$BUILD_DIR" ${cutlass_define:+-C "cmake.define.MXMOE_CUTLASS_DIR=$cutlass_define"}
echo "setup: Python package mxmoe installed for $("$MXMOE_PYTHON" -c 'import sys; print(sys.executable)')"
