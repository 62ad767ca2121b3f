#!/usr/bin/env bash
# Fails when a C++ file of mlacp is not formatted as .clang-format says. `--fix` rewrites them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.hpp' '*.cpp' | while read -r f; do [[ -f $f ]] && echo "$f"; done)
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if clang-format --dry-run --Werror "${files[@]}"; then
  echo "format check: ${#files[@]} files clean"
else
  echo "format check failed: run ./scripts/check-format.sh --fix" >&2
  exit 1
fi
