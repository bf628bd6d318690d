#!/usr/bin/env bash
# The trained-transformer study's smoke check (docs/trained_models.md): makes a venv, installs
# torch from PyPI without its CUDA dependency tree (the CPU is all the study needs), installs
# phasekv from this checkout, then runs python/tests/test_phase_training.py (torch forward vs
# phasekv's kernels, the masks vs phasekv.Geometry, and `study.py --smoke`, a few training
# steps per design) and python/tests/test_torch.py.
#
#   scripts/test-training-smoke.sh
#
# Environment: VENV (default build/training-smoke-venv; reused when it exists), PHASEKV_INSTALLED
# (1: VENV already has this checkout's phasekv, so it is not built again), PYTHON
# (default python3), PHASEKV_TORCH_WHEELS (a folder of already downloaded wheels, passed to
# pip as --find-links; pip's own cache is used as usual). The torch wheel is large (about
# 540 MB): a populated pip cache or wheel folder saves the download.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
VENV=${VENV:-build/training-smoke-venv}
PY=${PYTHON:-python3}
links=()
if [ -n "${PHASEKV_TORCH_WHEELS:-}" ]; then links=(--find-links "$PHASEKV_TORCH_WHEELS"); fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
# torch's metadata asks for the whole CUDA 13 stack; these are the pieces its CPU import needs.
pip install -q "${links[@]}" --no-deps torch==2.15.0 nvidia-nccl-cu13==2.30.7 \
  nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2 nvidia-cufile==1.20.0.107
pip install -q "${links[@]}" filelock typing-extensions sympy networkx jinja2 fsspec \
  'setuptools>=77' numpy pytest ml_dtypes matplotlib
# PHASEKV_INSTALLED=1: the venv already holds this checkout's phasekv (CI's python-wheel leg).
if [ "${PHASEKV_INSTALLED:-0}" != 1 ]; then
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-1} pip install -q .
fi
if ! python -c "import torch" 2>/dev/null; then
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  python -c "import torch"
fi
installed=$(date +%s)
echo "test-training-smoke: venv ready in $((installed - start)) s (torch $(python -c \
  'import torch; print(torch.__version__)'))"
python -m pytest -q python/tests/test_phase_training.py python/tests/test_torch.py
end=$(date +%s)
echo "test-training-smoke: tests $((end - installed)) s, total $((end - start)) s"
