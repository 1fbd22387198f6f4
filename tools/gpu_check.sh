#!/usr/bin/env bash
# Everything the CPU suite cannot check, on a machine with an NVIDIA GPU, after `make setup`:
# GPU-only tests, the CPU suite pointed at the GPU (float32: token-exact; bfloat16: teacher-
# forced logits), the judge's self-check, and the speed benchmarks (figures are printed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "== $*"; "$@" || status=1; }
step $PY -m pytest -q -p no:cacheprovider -m gpu tests
step env MINISGL_TEST_DEVICE=cuda MINISGL_TEST_ORACLE=recompute $PY -m pytest -q -p no:cacheprovider tests/test_ch0[1-9]_*.py tests/test_ch1[01]_*.py
step env MINISGL_TEST_DEVICE=cuda MINISGL_TEST_DTYPE=bfloat16 $PY -m pytest -q -p no:cacheprovider tests/test_ch06_engine.py -k logits
step $PY judge.py check
step $PY -m minisgl.benchmark.offline --hf-baseline 32
step $PY -m minisgl.benchmark.decode
if [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then step $PY -m minisgl.benchmark.offline --tp-size 2; fi
step $PY -m minisgl.benchmark.moe
exit $status
