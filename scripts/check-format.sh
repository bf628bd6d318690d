#!/usr/bin/env bash
# Checks that every C++ and CUDA source in the tree is formatted as .clang-format says.
#   scripts/check-format.sh          list the files that differ (exit 1 if any)
#   scripts/check-format.sh --fix    rewrite them in place
# Uses clang-format-14 (Debian package clang-format-14), or $CLANG_FORMAT.
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$CF" ]; then
  echo "check-format: clang-format not found (apt-get install clang-format-14)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.inl' '*.inc' '*.cuh' '*.cu' '*.h')
if [ "${1:-}" = "--fix" ]; then
  "$CF" -i --style=file "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$CF" --style=file "$f" | cmp -s - "$f"; then
    echo "not formatted: $f"
    bad=$((bad + 1))
  fi
done
if [ "$bad" -gt 0 ]; then
  echo "check-format: $bad of ${#files[@]} files differ from .clang-format ($("$CF" --version));" \
       "run scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted ($("$CF" --version))"
