#!/usr/bin/env bash
# Checks the tree is formatted (tools/format.sh --check), then runs the test suite from build/.
# Arguments go to ctest, e.g. -L unit, -L integration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/format.sh --check
ctest --test-dir build --output-on-failure -j "${SANAFLOW_JOBS:-$(nproc)}" "$@"
