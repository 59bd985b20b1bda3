#!/usr/bin/env bash
# The project's own Python (.venv, made by tools/setup.sh with pinned packages from
# tools/python-requirements.txt), quiet about numpy-less imports. Never the system Python.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "python: $root/.venv is missing: run bash tools/setup.sh" >&2
  exit 2
fi
exec "$root/.venv/bin/python" "$@"
