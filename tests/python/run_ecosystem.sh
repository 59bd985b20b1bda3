#!/usr/bin/env bash
# ctest's entry for ecosystem_test.py. Exits 77 (ctest: skipped), saying why, when the project's
# Python environment is absent; any other failure is a failure.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$root/.venv/bin/python"
if [ ! -x "$python" ]; then
  echo "ecosystem: skipped: no $root/.venv (bash tools/setup.sh makes it)"
  exit 77
fi
if ! "$python" -c "import diffusers, peft, lmdb, safetensors, xxhash, zstandard, tensorboard" 2>/dev/null; then
  echo "ecosystem: skipped: $root/.venv lacks the packages of tools/python-requirements.txt"
  exit 77
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore
exec "$python" "$root/tests/python/ecosystem_test.py"
