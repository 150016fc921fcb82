"""Helpers of the online tests (``rlgate serve --online``): an app with tenants, and requests as a tenant."""

from __future__ import annotations

from typing import Any

from helpers import ADMIN_KEY, admin_headers


def online_app(tokenizer, stop_ids, store=None, gateway: dict[str, Any] | None = None, engine=None, **online: Any):
    """A gateway app with ``OnlineConfig(online=True, **online)`` on the fake engine (``gateway``: more
    ``GatewayConfig`` fields; ``engine``: another engine)."""
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    config = GatewayConfig(admin_key=ADMIN_KEY, **(gateway or {}))
    return create_app(config, engine or FakeEngine(tokenizer), store or MemoryStore(), tokenizer, stop_token_ids=stop_ids,
                      online=OnlineConfig(online=True, **online))


async def new_tenant(client, name: str = "acme") -> tuple[str, dict[str, str]]:
    """(tenant id, its request headers)."""
    r = await client.post("/v1/tenants", json={"name": name}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


async def chat(client, headers: dict[str, str], messages: list[dict[str, Any]], conversation: str | None = None) -> str:
    """One chat turn as a tenant; returns the response id."""
    extra = {"X-Conversation-Id": conversation} if conversation else {}
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 4},
                          headers={**headers, **extra})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def reply_of(app, turn_id: str) -> dict[str, Any]:
    """The assistant message a turn answered (as a client would send it back)."""
    found = app.state.online.conversations.find_turn(None, turn_id)
    assert found is not None
    return {"role": "assistant", "content": found[1].output_message.text}


class Recorder:
    """A stepper that keeps what it was given (the real one is GRPOTrainer.step, through train/online.py)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], list[str], int]] = []

    def step(self, samples: list[Any], group_ids: list[str], current_version: int) -> dict[str, float]:
        self.calls.append((samples, group_ids, current_version))
        return {"loss": 0.0}


def wired(tokenizer, stop_ids, *, stepper=None, publish=None, store=None, script=None, scorer=None,
          online: dict[str, Any] | None = None, **opts: Any):
    """An online gateway on two fake engines (stable + spare, ``script``: their replies) with online training:
    the trainer steps ``stepper`` (default: a :class:`Recorder`) and offers candidates through ``publish``
    (default: none can start). Returns (app, training, stepper)."""
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.online.canary import Canary
    from rlgate.online.groups import LiveGroups, scorer_of
    from rlgate.online.trainer import OnlineTrainer
    from rlgate.online.training import OnlineTraining
    from rlgate.online.versions import TwoSlotEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    options = OnlineConfig(**opts)
    canary = Canary(options)
    engines = TwoSlotEngine(FakeEngine(tokenizer, output_tokens=3, script=script),
                            FakeEngine(tokenizer, output_tokens=3, script=script), canary)
    stepper = stepper if stepper is not None else Recorder()

    async def no_candidate() -> int | None:
        return None

    trainer = OnlineTrainer(options, stepper, publish or no_candidate)
    training = OnlineTraining(options, canary, engines, trainer, poll_interval=0.01)
    if scorer is not None:
        training.groups = LiveGroups(options, engines, scorer_of(scorer), training.add_group, decode=tokenizer.decode)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engines, store or MemoryStore(), tokenizer,
                     stop_token_ids=stop_ids, online=OnlineConfig(online=True, **(online or {})),
                     online_training=training)
    return app, training, stepper
