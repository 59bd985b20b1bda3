#!/usr/bin/env bash
# The GPU check: CI's second build (tools/build.sh --torch2, which CI compiles on every change)
# on a machine with a GPU, then the gpu tests and the memory ablation on the device. For a machine
# with CUDA, CMake and PyTorch but no Debian -dev packages and no package registry (DESIGN.md
# section 8): media is left out, and without the project's .venv the machine's own PyTorch is used.
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
if [ -d .deps ]; then
  export CMAKE_PREFIX_PATH="$PWD/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu/pkgconfig:$PWD/.deps/usr/share/pkgconfig"
  export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
bash tools/build.sh --torch2 -DSANAFLOW_WITH_MEDIA=OFF
# The unit and gpu tests include NCCL: World.TheNcclProcessGroupRunsOrIsRefusedWithoutAGpu (one
# rank's all-reduce on cuda:0) and GpuDataParallel.NcclRanksGetTheWholeBatchsGradients (a rank per
# GPU, two at most, the gradient buckets all-reduced by NCCL from inside the backward pass).
ctest --test-dir build-torch2 -L 'unit|gpu' --output-on-failure
build-torch2/tests/gpu_tests --gtest_brief=0
build-torch2/tools/bench/memory_ablation --device cuda --grids "$grid"
