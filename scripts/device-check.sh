#!/usr/bin/env bash
# One-call GPU check for phasekv's CUDA kernels (issue 5).
#
# On a machine with an NVIDIA GPU: configures a fresh Release build for sm_90 (tests and
# benchmarks only), builds them with all cores, runs the CUDA tests, the serving CUDA tests
# (tests/serving: paged batch decode, ragged prefill, paged append) and the DeepSeek-V4 CUDA
# tests (tests/dsv4: indexer, sparse attention contiguous and paged, compressor), runs compute-sanitizer memcheck on a small
# subset of each (when available), runs the CUDA benchmarks briefly and
# prints a short table last. Full logs go to $OUT/device-check/ when OUT is set (else to the build
# folder). Every step has a timeout and the whole script stays under 8 minutes.
#
# Usage: scripts/device-check.sh [build-dir]      (default: build/device-check)
# Environment: OUT (log folder), CUDA_ARCH (default 90), DEVICE_CHECK_BUDGET_S (default 470).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build/device-check}"
ARCH="${CUDA_ARCH:-90}"
BUDGET="${DEVICE_CHECK_BUDGET_S:-470}"
if [[ -n "${OUT:-}" ]]; then LOGS="$OUT/device-check"; else LOGS="$BUILD/logs"; fi
mkdir -p "$LOGS"
SECONDS=0

note() { printf '[device-check %3ds] %s\n' "$SECONDS" "$*" | tee -a "$LOGS/summary.log"; }

# run_step NAME WANT_SECONDS LOG CMD...: runs CMD with a timeout of min(WANT, time left - 15 s);
# returns the command's status (124 on timeout, 125 when no time was left).
run_step() {
  local name="$1" want="$2" log="$3"
  shift 3
  local left=$((BUDGET - SECONDS - 15))
  local limit=$((want < left ? want : left))
  if ((limit < 5)); then
    note "$name: skipped (time budget spent)"
    return 125
  fi
  note "$name: start (timeout ${limit}s, log $log)"
  timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  note "$name: exit $rc"
  return "$rc"
}

CONFIGURE="not run"; BUILD_RESULT="not run"; TESTS="not run"; MEMCHECK="not run"
SERVING="not run"; SERVING_MEMCHECK="not run"; DSV4="not run"; DSV4_MEMCHECK="not run"
DSV4_COMP="not run"; DSV4_PAGED="not run"
DECODE_FRAC="n/a"; SPEEDUP="n/a"; PREFILL_TF="n/a"; COPY_BW="n/a"; GPU="none"

if command -v nvidia-smi >/dev/null 2>&1; then
  GPU="$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  timeout 20 nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1
fi
note "GPU: ${GPU:-unknown}"

GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
JOBS="$(nproc 2>/dev/null || echo 4)"

rm -rf "$BUILD"
if run_step configure 90 "$LOGS/configure.log" \
    cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DPHASEKV_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
      -DPHASEKV_BUILD_TESTS=ON -DPHASEKV_BUILD_BENCHMARKS=ON -DPHASEKV_BUILD_EXAMPLES=OFF \
      -DPHASEKV_BUILD_TOOLS=OFF -DPHASEKV_BUILD_DOCS=OFF; then
  CONFIGURE="ok"
else
  CONFIGURE="failed"
fi

TEST_BIN="$BUILD/tests/cuda/test_cuda"
BENCH_BIN="$BUILD/benchmarks/cuda/bench_cuda"
SERVING_BIN="$BUILD/tests/serving/test_serving_cuda"
DSV4_BIN="$BUILD/tests/dsv4/test_dsv4_cuda"
if [[ "$CONFIGURE" == ok ]]; then
  if run_step build 240 "$LOGS/build.log" \
      cmake --build "$BUILD" --target test_cuda test_serving_cuda test_dsv4_cuda bench_cuda -j "$JOBS"; then
    BUILD_RESULT="ok"
  else
    BUILD_RESULT="failed (see build.log)"
  fi
fi

# test_counts LOG RC: "P passed, F failed, S skipped (exit RC)" from a GoogleTest log.
test_counts() {
  local passed failed skipped
  passed="$(grep -Eo '\[  PASSED  \] [0-9]+' "$1" | grep -Eo '[0-9]+$' | tail -n 1)"
  failed="$(grep -Eo '\[  FAILED  \] [0-9]+ test' "$1" | grep -Eo '[0-9]+' | tail -n 1)"
  skipped="$(grep -Eo '\[  SKIPPED \] [0-9]+' "$1" | grep -Eo '[0-9]+$' | tail -n 1)"
  echo "${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped (exit $2)"
}

# suite_counts LOG PREFIX: "P passed, F failed, S skipped" over the tests whose name starts
# with PREFIX (a suite name, e.g. CompressorCuda), from a GoogleTest log.
suite_counts() {
  local passed failed skipped
  passed="$(grep -Ec "^\[       OK \] $2[.A-Za-z]" "$1")"
  failed="$(grep -E "^\[  FAILED  \] $2[.A-Za-z]" "$1" | grep -c ' (')"
  skipped="$(grep -E "^\[  SKIPPED \] $2[.A-Za-z]" "$1" | grep -c ' (')"
  echo "$passed passed, $failed failed, $skipped skipped"
}

# memcheck_result LOG RC: the table text of a compute-sanitizer run.
memcheck_result() {
  case "$2" in
    0) echo "clean ($(grep -Eo 'ERROR SUMMARY: [0-9]+ errors' "$1" | tail -n 1))" ;;
    3) echo "ERRORS ($(grep -Eo 'ERROR SUMMARY: [0-9]+ errors' "$1" | tail -n 1))" ;;
    124|137) echo "timed out" ;;
    125) echo "skipped (time)" ;;
    *) echo "exit $2 (test failures or tool error; see $(basename "$1"))" ;;
  esac
}

if [[ -x "$TEST_BIN" ]]; then
  run_step tests 90 "$LOGS/tests.log" "$TEST_BIN" --gtest_output="xml:$LOGS/tests.xml"
  rc=$?
  TESTS="$(test_counts "$LOGS/tests.log" "$rc")"
fi

if [[ -x "$TEST_BIN" ]]; then
  SAN="$(command -v compute-sanitizer || true)"
  if [[ -z "$SAN" && -x /usr/local/cuda/bin/compute-sanitizer ]]; then
    SAN=/usr/local/cuda/bin/compute-sanitizer
  fi
  if [[ -n "$SAN" ]]; then
    run_step memcheck 75 "$LOGS/memcheck.log" "$SAN" --tool memcheck --error-exitcode 3 \
      "$TEST_BIN" --gtest_filter='CudaDecode.Bf16MatchesReference:CudaPrefill.TensorCoreBf16WithinDerivedBound:CudaPrefill.GenericF32MatchesReference:CudaCompress.GatedGenericBf16BitExact:CudaCompress.UniformMeanF16BitExact'
    MEMCHECK="$(memcheck_result "$LOGS/memcheck.log" $?)"
  else
    MEMCHECK="compute-sanitizer not found"
  fi
fi

# The serving twin (paged batch decode, ragged prefill, paged append): its tests, then
# memcheck on the small cases (rings, HND, dense tables, sinks, device GatedPool parameters).
if [[ -x "$SERVING_BIN" ]]; then
  run_step serving-tests 60 "$LOGS/serving-tests.log" "$SERVING_BIN" \
    --gtest_output="xml:$LOGS/serving-tests.xml"
  SERVING="$(test_counts "$LOGS/serving-tests.log" $?)"
  if [[ -n "${SAN:-}" ]]; then
    run_step serving-memcheck 45 "$LOGS/serving-memcheck.log" "$SAN" --tool memcheck \
      --error-exitcode 3 "$SERVING_BIN" --gtest_filter='BatchDecodeCuda.LayoutsRingsVariantsAndUncompressedWithinReference:BatchDecodeCuda.StaleLengthsGiveNan:BatchPrefillCuda.RingLayoutsAndVariantsWithinReference:PagedAppendCuda.GatedPoolSameBitsAsCpu'
    SERVING_MEMCHECK="$(memcheck_result "$LOGS/serving-memcheck.log" $?)"
  else
    SERVING_MEMCHECK="compute-sanitizer not found"
  fi
fi

# The DeepSeek-V4 twin (lightning indexer, sparse attention contiguous and paged, compressor
# batch and paged append): its tests (the compressor's and the paged sparse attention's device
# cases get their own table rows), then memcheck on the small cases (padding, nothing visible,
# an invalid index, ties, a ring over a ragged batch, the compressor's batch).
if [[ -x "$DSV4_BIN" ]]; then
  run_step dsv4-tests 60 "$LOGS/dsv4-tests.log" "$DSV4_BIN" \
    --gtest_output="xml:$LOGS/dsv4-tests.xml"
  DSV4="$(test_counts "$LOGS/dsv4-tests.log" $?)"
  DSV4_COMP="$(suite_counts "$LOGS/dsv4-tests.log" CompressorCuda)"
  DSV4_PAGED="$(suite_counts "$LOGS/dsv4-tests.log" PagedSparseCuda)"
  if [[ -n "${SAN:-}" ]]; then
    run_step dsv4-memcheck 55 "$LOGS/dsv4-memcheck.log" "$SAN" --tool memcheck \
      --error-exitcode 3 "$DSV4_BIN" --gtest_filter='SparseAttentionCuda.F32SevenTokensOneHead:SparseAttentionCuda.OneTokenAndNothingVisible:SparseAttentionCuda.InvalidIndexGivesNanForItsQuery:IndexerCuda.F32SevenTokensPadding:IndexerCuda.F16NinetySevenQueriesWithTies:PagedSparseCuda.F32RingRaggedLists:PagedSparseCuda.NothingVisible:CompressorCuda.BatchF32WithinReference'
    DSV4_MEMCHECK="$(memcheck_result "$LOGS/dsv4-memcheck.log" $?)"
  else
    DSV4_MEMCHECK="compute-sanitizer not found"
  fi
fi

if [[ -x "$BENCH_BIN" ]]; then
  run_step benchmarks 120 "$LOGS/bench.log" "$BENCH_BIN" \
    --benchmark_out="$LOGS/bench.json" --benchmark_out_format=json
  # Pull counters out of the JSON (one key per line): name -> counter value.
  counter() {  # counter NAME_REGEX KEY
    [[ -f "$LOGS/bench.json" ]] || return 0
    awk -v pat="$1" -v key="\"$2\":" '
      /"name":/ { name = $0; sub(/.*"name": *"/, "", name); sub(/".*/, "", name) }
      index($0, key) && name ~ pat { v = $0; sub(/.*: */, "", v); sub(/,.*/, "", v); print v; exit }
    ' "$LOGS/bench.json"
  }
  fmt() { [[ -n "$1" ]] && printf '%.3f' "$1" 2>/dev/null || echo "n/a"; }
  DECODE_FRAC="$(fmt "$(counter 'BM_Decode<bf16_t>/tokens:131072/compressed:0' frac_copy)")"
  COPY_BW="$(fmt "$(counter 'BM_Decode<bf16_t>/tokens:131072/compressed:0' copy_GBps)")"
  SPEEDUP="$(fmt "$(counter 'BM_DecodeCompressedSpeedup' speedup)")"
  PREFILL_TF="$(fmt "$(counter 'BM_Prefill<bf16_t>/queries:8192/tensor_core:1' TFLOPs)")"
fi

note "done in ${SECONDS}s"
{
  echo
  echo "phasekv device check (sm_$ARCH, ${SECONDS}s)  GPU: ${GPU:-unknown}"
  printf '%-46s %s\n' "configure / build" "$CONFIGURE / $BUILD_RESULT"
  printf '%-46s %s\n' "CUDA tests" "$TESTS"
  printf '%-46s %s\n' "compute-sanitizer memcheck (subset)" "$MEMCHECK"
  printf '%-46s %s\n' "serving CUDA tests (tests/serving)" "$SERVING"
  printf '%-46s %s\n' "serving memcheck (subset)" "$SERVING_MEMCHECK"
  printf '%-46s %s\n' "DeepSeek-V4 CUDA tests (tests/dsv4)" "$DSV4"
  printf '%-46s %s\n' "  of which compressor (CompressorCuda* suites)" "$DSV4_COMP"
  printf '%-46s %s\n' "  of which paged sparse (PagedSparseCuda*)" "$DSV4_PAGED"
  printf '%-46s %s\n' "DeepSeek-V4 memcheck (subset)" "$DSV4_MEMCHECK"
  printf '%-46s %s\n' "device-to-device copy, GB/s (read+write)" "$COPY_BW"
  printf '%-46s %s\n' "decode bf16 131k tok, fraction of copy BW" "$DECODE_FRAC   (target >= 0.75)"
  printf '%-46s %s\n' "decode W8/S4+L128 vs uncompressed, speed-up" "$SPEEDUP   (target >= 3.2)"
  printf '%-46s %s\n' "prefill bf16 mma.sync 8192 q, TFLOP/s" "$PREFILL_TF"
  echo "logs: $LOGS"
} | tee "$LOGS/table.txt"
