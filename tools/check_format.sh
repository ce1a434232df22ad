#!/usr/bin/env bash
# Fails when a C++ source does not follow .clang-format. tools/check_format.sh --fix rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard -- '*.h' '*.c' '*.cpp' '*.cu' '*.cuh')
else  # an exported tree without git: every source under the project's own folders
  mapfile -t files < <(find src tests bench \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -type f | sort)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "check_format: no sources found (run from the repository)" >&2
  exit 1
fi
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: not clang-formatted (run tools/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files ok"
