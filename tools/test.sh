#!/usr/bin/env bash
# Runs the test suite from build/. Arguments go to ctest, e.g. -L unit, -L integration.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j "${SANAFLOW_JOBS:-$(nproc)}" "$@"
