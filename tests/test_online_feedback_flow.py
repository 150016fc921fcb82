"""Feedback that reaches training, and a canary cycle in minutes (issue 36, failures 5 and 6): conversation-level
feedback reaches the trainer and the canary; the default --conversation-idle-s lets the next candidate load a
minute after a promotion (at once after a rollback); feedback metadata is bounded; the trainer's candidates
and checkpoints pushed through /rl/update_weights never share a version."""

from __future__ import annotations

import asyncio
import random

from helpers import admin_headers, eventually
from online_helpers import chat, new_tenant, reply_of, wired
from rlgate.config import OnlineConfig
from rlgate.engine.base import GenerateRequest, SamplingParams
from rlgate.engine.fake import FakeEngine
from rlgate.online.canary import Canary
from rlgate.online.versions import TwoSlotEngine


async def test_conversation_level_feedback_reaches_the_trainer_and_the_canary(tokenizer, stop_ids, asgi_client):
    app, training, _ = wired(tokenizer, stop_ids, train_batch=100)
    trainer, canary, tail = training.trainer, training.canary, training.feedback
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        first = await chat(c, tenant, [{"role": "user", "content": "my order is late"}], conversation="support-1")
        history = [{"role": "user", "content": "my order is late"}, reply_of(app, first)]
        last = await chat(c, tenant, [*history, {"role": "user", "content": "where is it now?"}],
                          conversation="support-1")
        r = await c.post("/v1/feedback", json={"kind": "outcome", "value": 1.0, "conversation_id": "support-1",
                                               "source": "delayed"}, headers=tenant)
        assert r.status_code == 200 and r.json()["reward"] == 1.0
        await eventually(lambda: trainer.pending_samples == 1, what="the conversation's reward in the trainer")
        (unit,) = trainer.pending
        assert unit.samples[0].id == last and unit.samples[0].reward == 1.0 and unit.conversation == "support-1"
        assert canary.rewards[0].n == 1 and canary.rewards[0].total == 1.0  # credited to the version that served
        assert tail.counts["conversation_events"] == 1
        # a later turn-level thumbs down on that turn combines with the conversation's outcome: 0 (mean)
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": False, "interaction_id": last},
                         headers=tenant)
        assert r.status_code == 200
        await eventually(lambda: tail.counts["reward_changes"] == 1, what="the changed reward")
        assert trainer.pending[-1].samples[0].reward == 0.0 and first


async def test_feedback_metadata_is_bounded(tokenizer, stop_ids, asgi_client):
    app, _, _ = wired(tokenizer, stop_ids)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        turn = await chat(c, tenant, [{"role": "user", "content": "x"}], conversation="a")
        big = {"blob": "x" * 5000}
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn,
                                               "metadata": big}, headers=tenant)
        assert r.status_code == 400 and r.json()["error"]["param"] == "metadata"
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn,
                                               "metadata": {"blob": "x" * 4000}}, headers=tenant)
        assert r.status_code == 200


def _route_all(engine: TwoSlotEngine, sessions: list[str]) -> None:
    async def go() -> None:
        for s in sessions:
            await engine.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2), session_id=s))
    asyncio.run(go())


def test_the_next_candidate_loads_a_minute_after_a_promotion_and_at_once_after_a_rollback(tokenizer) -> None:
    """The issue: --conversation-idle-s 600 blocked the next candidate for 10 minutes after each promotion."""
    now = [1000.0]
    canary = Canary(OnlineConfig(canary_share=0.5), clock=lambda: now[0], rng=random.Random(0))
    engine = TwoSlotEngine(FakeEngine(tokenizer, output_tokens=2), FakeEngine(tokenizer, output_tokens=2), canary)

    async def noop(e: object) -> None:
        return None

    assert asyncio.run(engine.load_candidate(1, noop))
    _route_all(engine, [f"s{i}" for i in range(20)])
    on_stable = [f"s{i}" for i in range(20) if canary.route(f"s{i}") == 0]
    canary.promote()
    now[0] += 30
    # the previous stable version keeps serving its conversations until its slot is reused
    assert all(canary.route(s) == 0 for s in on_stable)
    assert not engine.can_load()
    now[0] += 61  # the default conversation_idle_s (60 s) after their last turn
    assert engine.can_load()
    assert asyncio.run(engine.load_candidate(2, noop)) and canary.canary_version == 2
    assert canary.route(on_stable[0]) in (1, 2) and canary.switched >= 1  # its version is gone: it moved
    _route_all(engine, [f"n{i}" for i in range(20)])  # some new conversations on the canary
    canary.rollback()
    assert engine.can_load()  # a rolled-back version serves nobody: no wait


async def test_trainer_candidates_and_pushed_checkpoints_never_share_a_version(
        tiny_model_dir, tokenizer, stop_ids, asgi_client, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from helpers import ADMIN_KEY
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore
    from rlgate.train.online import build_online_training
    from rlgate.train.policy import save_for_serving

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    training = build_online_training(model, OnlineConfig(train=True), tokenizer)
    policy = training.trainer.stepper
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), training.engines, MemoryStore(), tokenizer,
                     stop_token_ids=stop_ids, online=OnlineConfig(online=True), online_training=training)
    save_for_serving(model, tmp_path / "pushed")
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        assert await policy.publish() == 1
        training.canary.rollback()
        r = await c.post("/rl/update_weights", json={"path": str(tmp_path / "pushed")}, headers=admin_headers())
        assert r.status_code == 200 and r.json()["version"] == 2
        training.canary.rollback()
        assert await policy.publish() == 3  # was 2 again: two weight sets under one version
        starts = [d.version for d in training.canary.decisions if d.action == "start"]
        assert starts == [1, 2, 3]
