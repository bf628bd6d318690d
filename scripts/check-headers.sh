#!/usr/bin/env bash
# Every public header compiles on its own (engines vendor them one by one): each
# include/phasekv/**/*.hpp is included alone into an empty translation unit and checked with
# `-std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only`, by g++ and by clang++ (each that
# exists, or the compilers named in $CXX_LIST). The .cuh headers need nvcc and are compiled by
# the CUDA test targets; the .inl / .inc files are kernel bodies and X-macro passes that the
# headers include, not headers to include. Also checks that attention/ includes nothing from
# the layers above it. Exits non-zero when any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
compilers=${CXX_LIST:-}
if [ -z "$compilers" ]; then
  for c in g++ clang++; do command -v "$c" >/dev/null && compilers="$compilers $c"; done
fi
[ -n "$compilers" ] || { echo "check-headers: no C++ compiler found"; exit 1; }
mapfile -t headers < <(git ls-files 'include/*.hpp' | sed 's#^include/##')
check_one() {  # compiler header
  local out
  if ! out=$(echo "#include <$2>" | "$1" -std=c++17 -Wall -Wextra -Wpedantic -Werror \
             -fsyntax-only -I include -x c++ - 2>&1); then
    printf 'FAIL %s %s\n%s\n' "$1" "$2" "$(printf '%s\n' "$out" | head -n 8)"
    return 1
  fi
}
export -f check_one
failed=0
for c in $compilers; do
  printf '%s\n' "${headers[@]}" |
    xargs -P "${JOBS:-2}" -I{} bash -c 'check_one "$0" "$1"' "$c" {} || failed=1
  echo "check-headers: ${#headers[@]} headers with $c"
done
# Layering: the attention kernels depend on nothing above them (compress/, serving/, dsv4/,
# eval/ build on attention/, not the other way round).
if up=$(grep -rnE '#include "phasekv/(compress|serving|dsv4|eval)/' include/phasekv/attention); then
  printf 'FAIL layering: attention/ includes a layer above it\n%s\n' "$up"
  failed=1
fi
[ "$failed" -eq 0 ] && echo "check-headers: every header compiles on its own" || exit 1
