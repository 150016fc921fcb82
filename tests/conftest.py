"""Shared fixtures: the tiny model is built once per test session, offline."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `rlgate serve` subprocesses keep nothing on disk unless a test passes --store
os.environ.setdefault("RLGATE_STORE", ":memory:")

from pathlib import Path

import pytest

from helpers import ADMIN_KEY


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlgate.demo.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)



@pytest.fixture(scope="session")
def stop_ids(tokenizer, tiny_model_dir) -> list[int]:
    from rlgate.model import stop_token_ids

    return stop_token_ids(tokenizer, tiny_model_dir)


@pytest.fixture
def engine_kind() -> str:
    """Where make_app()'s engine runs: "local" (in the gateway), or "sglang" / "vllm" (behind a fake
    server of that kind, driven by the remote engine; see remote_helpers.py). Parametrise it to rerun
    a test against the remote engines."""
    return "local"


@pytest.fixture
def make_app(tokenizer, stop_ids, engine_kind, tiny_model_dir):
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

                engine = serve_remotely(backends, engine_kind, engine, tokenizer, tiny_model_dir)
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
