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

.PHONY: demo test test-fast lint fuzz bench install browser clean

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

# Debian's chromium + chromium-driver for the viewer's browser tests (tests/browser.py), when missing.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	    echo "make browser: not root and no sudo: the browser tests will skip (CI fails them)"; exit 0; fi; \
	  echo "installing chromium + chromium-driver (Debian packages) for the viewer tests"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    --no-install-recommends chromium chromium-driver >/dev/null; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint browser
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not slow'

fuzz: $(STAMP)
	RLGATE_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q tests/test_fuzz.py

bench: $(STAMP)
	for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache
