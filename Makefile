# Two commands set everything up on a fresh machine:
#   make demo   - offline demo (creates .venv, installs, runs `rlgate demo`)
#   make test   - the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := $(VENV)/.torch
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast lint fuzz bench install clean

# torch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build here
$(TORCH):
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	touch $(TORCH)

$(DEMO_STAMP): pyproject.toml $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/rlgate demo --out demo-out

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not slow'

fuzz: $(STAMP)
	RLGATE_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q tests/test_fuzz.py

bench: $(STAMP)
	for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache
