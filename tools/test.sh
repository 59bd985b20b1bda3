#!/usr/bin/env bash
# Runs the test suite. Arguments go to ctest, e.g. -L unit, -L integration.
#
#   bash tools/test.sh           checks the tree is formatted (tools/format.sh --check), then runs
#                                every test of build/ (Debian's LibTorch 1.13)
#   bash tools/test.sh --torch2  runs every test of build-torch2/ (PyPI's CUDA LibTorch 2.x) on the
#                                CPU; the gpu tests skip, saying so, without a device
#   bash tools/test.sh --asan    builds the storage, graph and stages unit tests with ASan and
#                                UBSan (build-asan/; the model libraries are build/'s) and runs them
#                                (all but the planner's predictions)
#   bash tools/test.sh --fuzz    builds the fuzzers (tools/fuzz/) and runs each for
#                                SANAFLOW_FUZZ_SECONDS (default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
if [ "${1:-}" = "--asan" ]; then
  # The model libraries come from build/ (uninstrumented, like LibTorch: SANAFLOW_MODEL_PREBUILT in
  # model/CMakeLists.txt), brought up to date first.
  [ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j"$(nproc)" --target sanaflow_model_common sanaflow_model_sana \
    sanaflow_model_dc_ae sanaflow_model_gemma sanaflow_model_wan sanaflow_model_sana_video \
    sanaflow_sentencepiece
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSANAFLOW_SANITIZE=ON \
    "-DSANAFLOW_MODEL_PREBUILT=$PWD/build" >/dev/null
  cmake --build build-asan -j"$(nproc)" --target storage_tests graph_tests stages_tests
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  # The planner's predictions (Plan*) are a few hundred tiny training steps whose time is LibTorch's
  # (uninstrumented): the same step code runs instrumented in the other stages tests.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  for t in storage graph stages; do
    echo "asan: ${t}_tests"
    filter='*'
    [ "$t" = stages ] && filter='-PlanPrediction.*:PlanSearch.*'
    build-asan/tests/${t}_tests --gtest_color=no --gtest_brief=1 "--gtest_filter=$filter"
  done
  exit 0
fi
if [ "${1:-}" = "--fuzz" ]; then
  exec bash tools/fuzz/run.sh --seconds "${SANAFLOW_FUZZ_SECONDS:-15}"
fi
if [ "${1:-}" = "--torch2" ]; then
  shift
  dir=build-torch2
else
  bash tools/format.sh --check
fi
ctest --test-dir "$dir" --output-on-failure -j "${SANAFLOW_JOBS:-$(nproc)}" "$@"
