# optloop: the two commands a newcomer needs are `make demo` and `make test`.
# Each sets up .venv from nothing (first time: ~10 min, most of it compiling llama.cpp).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# Portable llama.cpp build: a native (-march=native) build dies with SIGILL on
# CPUs that differ from the build host's, which is what CI machines are.
# LLAVA_BUILD=OFF skips the multimodal library (imported lazily, unused here).
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DLLAVA_BUILD=OFF
STAMP := $(VENV)/.optloop-installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-unit test-all bench ui clean-state help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

setup: $(STAMP)  ## create .venv and install everything (idempotent)

demo: setup  ## set up, then run the main job (the closed loop) on the embedded default
	$(PY) -m optloop.doctor
	$(PY) -m optloop.run --system md_flat --budget 3

test: setup  ## set up, then run unit and integration tests (what CI runs)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$status

test-unit: setup  ## only the fast unit tests
	$(PY) -m pytest -m "not integration and not slow" $(PYTEST_ARGS)

test-all: setup  ## every test, the slow ones included
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup  ## the embedded LM benchmark (calls/s, tokens/s, cache speed-up)
	$(PY) -m experiments.bench.lm

ui: setup  ## the MLflow UI on the project's store
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --port 5000

clean-state:  ## delete caches and run state (.optloop/), keep .venv and mlruns/
	rm -rf .optloop
