#!/usr/bin/env bash
# Runs every libFuzzer target of a `fuzz` preset build for a bounded time from a fixed seed,
# starting from the committed corpus (tests/fuzz/corpus/<name>, read only: new inputs go to a
# scratch folder), and fails on any finding. Prints per target the CPU time, executions per
# second and the coverage reached (cov: edges, ft: features, from -print_final_stats).
# Findings are copied to BUILD_DIR/fuzz-findings/ (add them to the corpus as regression tests
# once fixed).
#
# Usage: tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS_PER_TARGET=45] [SEED=1]
set -uo pipefail
build=${1:?usage: run_fuzzers.sh BUILD_DIR [SECONDS_PER_TARGET] [SEED]}
secs=${2:-45}
seed=${3:-1}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
TIMEFORMAT='%U %S'
for name in geometry compress attention serving report_reader; do
  exe=$build/tests/fuzz/fuzz_$name
  if [ ! -x "$exe" ]; then
    echo "fuzz_$name: missing ($exe); build the fuzz preset first"
    status=1
    continue
  fi
  mkdir -p "$work/$name"
  { time "$exe" -seed="$seed" -max_total_time="$secs" -print_final_stats=1 -timeout=30 \
      -max_len=512 -len_control=0 \
      -rss_limit_mb=2560 -artifact_prefix="$work/$name-" "$work/$name" "$src/corpus/$name" \
      >"$work/$name.log" 2>&1; } 2>"$work/$name.time"
  rc=$?
  read -r user sys <"$work/$name.time"
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", u + s }')
  cov=$(grep -E '^#[0-9]+[[:space:]].*cov: ' "$work/$name.log" | tail -1 |
        sed -E 's/.*(cov: [0-9]+ ft: [0-9]+).*/\1/')
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$work/$name.log")
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$work/$name.log")
  if [ $rc -eq 0 ]; then
    echo "fuzz_$name: ok, ${secs} s, cpu ${cpu} s, ${execs:-?} runs, ${rate:-?} exec/s, ${cov:-cov: ?}"
  else
    status=1
    echo "fuzz_$name: FINDING (exit $rc), cpu ${cpu} s, ${execs:-?} runs, ${cov:-cov: ?}"
    grep -vE '^#[0-9]+[[:space:]]' "$work/$name.log" | tail -40
    mkdir -p "$build/fuzz-findings"
    for f in "$work/$name"-*; do
      [ -e "$f" ] && cp "$f" "$build/fuzz-findings/" && echo "  kept $build/fuzz-findings/$(basename "$f")"
    done
  fi
done
exit $status
