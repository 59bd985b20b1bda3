#!/usr/bin/env bash
# Runs the test suite. Arguments go to ctest, e.g. -L unit, -L integration.
#
#   bash tools/test.sh           checks the tree is formatted (tools/format.sh --check), then runs
#                                every test of build/ (Debian's LibTorch 1.13)
#   bash tools/test.sh --torch2  runs every test of build-torch2/ (PyPI's CUDA LibTorch 2.x) on the
#                                CPU; the gpu tests skip, saying so, without a device
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
if [ "${1:-}" = "--torch2" ]; then
  shift
  dir=build-torch2
else
  bash tools/format.sh --check
fi
ctest --test-dir "$dir" --output-on-failure -j "${SANAFLOW_JOBS:-$(nproc)}" "$@"
