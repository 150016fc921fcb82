"""Shared fixtures: the tiny model is built once per test session, offline."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlgate.demo.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


from helpers import ADMIN_KEY


@pytest.fixture(scope="session")
def stop_ids(tokenizer, tiny_model_dir) -> list[int]:
    from rlgate.model import stop_token_ids

    return stop_token_ids(tokenizer, tiny_model_dir)


@pytest.fixture
def make_app(tokenizer, stop_ids):
    """``make_app(engine=None, **config_overrides) -> app`` (fake engine by default)."""
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    def _make(engine=None, store=None, **overrides):
        engine = engine if engine is not None else FakeEngine(tokenizer)
        config = GatewayConfig(admin_key=ADMIN_KEY, **overrides)
        return create_app(config, engine, store or MemoryStore(), tokenizer, stop_token_ids=stop_ids)

    return _make


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
