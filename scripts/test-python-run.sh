#!/usr/bin/env bash
# The phasekv.run tests, the real-server one included: a venv, llama-cpp-python[server] built
# from its PyPI source (pip caches the wheel, so a second run skips the build), the C++
# phasekv-plan and phasekv-report, then pytest over python/tests/test_run*.py.
# Usage: scripts/test-python-run.sh [VENV_DIR] [BUILD_DIR]   (defaults build/venv-run, build/run-tools)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-build/venv-run}
BUILD=${2:-build/run-tools}
JOBS=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
t0=$SECONDS
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q httpx tqdm gguf numpy pytest
t1=$SECONDS
# A small llama.cpp: no examples, tests, tools or server of its own, no native -march, and
# compiled at -O0: the served model is a tiny random one, so the tests' generations still take
# seconds, and the build took 380 CPU-s (the default -O3 build took 1172 s of wall time on two
# shared cores).
CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF \
-DCMAKE_C_FLAGS_RELEASE=-O0 -DCMAKE_CXX_FLAGS_RELEASE=-O0" \
CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$VENV/bin/pip" install -q 'llama-cpp-python[server]'
t2=$SECONDS
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPHASEKV_ENABLE_CUDA=OFF \
  -DPHASEKV_BUILD_TESTS=OFF -DPHASEKV_BUILD_BENCHMARKS=OFF -DPHASEKV_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$BUILD" --target phasekv-plan phasekv-report
t3=$SECONDS
rc=0
PHASEKV_PLAN="$PWD/$BUILD/tools/phasekv-plan" PHASEKV_REPORT="$PWD/$BUILD/tools/phasekv-report" \
  "$VENV/bin/python" -m pytest -q -rs python/tests/test_run.py python/tests/test_run_sample_size.py \
  python/tests/test_run_llama_cpp.py || rc=$?
t4=$SECONDS
echo "test-python-run: venv + small packages $((t1 - t0)) s, llama-cpp-python $((t2 - t1)) s," \
     "C++ tools $((t3 - t2)) s, tests $((t4 - t3)) s"
exit $rc
