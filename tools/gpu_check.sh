#!/usr/bin/env bash
# The GPU check, for a machine with CUDA, CMake and PyTorch but no Debian -dev packages and no
# package registry (DESIGN.md section 8). Builds without media against the CUDA LibTorch inside
# PyTorch, runs the unit and gpu tests, then the memory ablation on the GPU at one grid.
#
# Before, on a machine with the Debian mirror, unpack what the GPU machine lacks beside the
# checkout (keep .deps out of git: echo /.deps/ >> .git/info/exclude):
#   ../shared/device/pack-debs.sh .deps liblmdb-dev liblmdb0 libzstd-dev libtbb-dev libtbb12 \
#     libtbbmalloc2 libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0 \
#     libsentencepiece-dev libsentencepiece0 libprotobuf-lite32 libgtest-dev libgmock-dev
# then carry .deps to the GPU machine and run: bash tools/gpu_check.sh [GRID]
set -euo pipefail
cd "$(dirname "$0")/.."
grid=${1:-64}
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
export CMAKE_PREFIX_PATH="$PWD/.deps/usr:$torch_prefix"
export PKG_CONFIG_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu/pkgconfig:$PWD/.deps/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSANAFLOW_WITH_MEDIA=OFF \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu -j "$(nproc)"
ctest --test-dir build-gpu -L 'unit|gpu' --output-on-failure
build-gpu/tests/gpu_tests --gtest_brief=0
build-gpu/tools/bench/memory_ablation --device cuda --grids "$grid"
