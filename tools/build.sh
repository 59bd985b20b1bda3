#!/usr/bin/env bash
# Configures and builds sanaflow. Extra arguments go to CMake's configure step, e.g.
# -DSANAFLOW_WITH_MEDIA=OFF.
#
#   bash tools/build.sh           build/ against Debian's CPU LibTorch 1.13 (the program lands at
#                                 build/sanaflow; what the demo runs)
#   bash tools/build.sh --torch2  build-torch2/ against the PyPI LibTorch 2.x that tools/setup.sh
#                                 installs into .venv (a CUDA build: compiled with the toolkit's
#                                 nvcc for sm_80 and sm_90, tested on the CPU where there is no GPU);
#                                 without .venv, the LibTorch of python3's torch (a GPU machine's)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${SANAFLOW_JOBS:-$(nproc)}
if [ "${1:-}" = "--torch2" ]; then
  shift
  python=python3
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
  prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
    echo "build.sh: no torch in $python (run bash tools/setup.sh)" >&2
    exit 2
  }
  torch_dir=$(dirname "$(dirname "$prefix")")
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  # The torch package's root as a prefix too: without it CMake finds Debian's libtorch.so in
  # the system paths before the package's own lib/.
  # No debug info (Release at -O2): this build checks that the code compiles and passes on
  # LibTorch 2.x, and -g doubles the compile time of every torch unit (CI's time budget).
  cmake -S . -B build-torch2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    "-DCMAKE_PREFIX_PATH=$prefix;$torch_dir" \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    -DTORCH_CUDA_ARCH_LIST="8.0;9.0" "$@" >/dev/null
  cmake --build build-torch2 -j "$jobs"
  exit
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$jobs"
