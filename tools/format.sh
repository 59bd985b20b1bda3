#!/usr/bin/env bash
# Formats the C++ sources with clang-format (the tree's .clang-format: Google base, 4-space
# indent, 100 columns). With --check it changes nothing, lists every file that is not formatted
# and exits 1: tools/test.sh runs it that way, so CI fails on an unformatted tree.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format: clang-format not found (bash tools/setup.sh installs it)" >&2
  exit 2
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h')
else
  mapfile -t files < <(find core storage graph model stages pipelines tools tests \
    \( -name '*.cpp' -o -name '*.h' \) -not -path 'tests/data/*' | sort)
fi
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "format: ${#bad[@]} of ${#files[@]} files are not formatted (run bash tools/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
else
  clang-format -i "${files[@]}"
  echo "format: ${#files[@]} files formatted in place"
fi
