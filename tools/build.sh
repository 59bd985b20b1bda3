#!/usr/bin/env bash
# Configures and builds sanaflow into build/ (the program lands at build/sanaflow). Extra
# arguments go to CMake's configure step, e.g. -DSANAFLOW_WITH_MEDIA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${SANAFLOW_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$jobs"
