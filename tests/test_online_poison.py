"""Training that cannot be poisoned (issue 36, failure 1): rewards are finite and in range before they are
stored or trained on; a non-finite loss, gradient or weight stops the step, drops its samples, alarms and
never reaches users; the trainer recovers by itself."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from helpers import admin_headers, eventually
from online_helpers import chat, new_tenant, wired
from rlgate.config import OnlineConfig
from rlgate.online.groups import LiveGroups, scorer_of
from rlgate.online.trainer import OnlineTrainer
from rlgate.trajectory.sample import Sample


def _sample(sid: str, reward: float, logprob: float = -1.0, prompt: tuple[int, ...] = (1, 2)) -> Sample:
    p = list(prompt)
    return Sample(id=sid, input_ids=p + [7, 8], loss_mask=[0] * len(p) + [1, 1],
                  logprobs=[0.0] * len(p) + [logprob, logprob], versions=[-1] * len(p) + [0, 0], reward=reward)


async def test_the_1e300_outcome_is_refused_and_nothing_reaches_the_trainer(tokenizer, stop_ids, asgi_client):
    """The attack of the issue: POST /v1/feedback {"kind": "outcome", "value": 1e300} was 200 with reward 1e300."""
    app, training, rec = wired(tokenizer, stop_ids, train_batch=1)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        turn = await chat(c, tenant, [{"role": "user", "content": "hello"}], conversation="a")
        for value in ("1e300", "-1e300", "1e999", "2"):  # 1e999 parses as inf
            r = await c.post("/v1/feedback", content=f'{{"kind": "outcome", "value": {value}, '
                             f'"interaction_id": "{turn}"}}', headers={**tenant, "Content-Type": "application/json"})
            assert r.status_code == 400, (value, r.text)
            assert r.json()["error"]["param"] == "value"
        assert "outcome-high" in r.json()["error"]["message"]
        r = await c.post("/v1/feedback", json={"kind": "outcome", "value": 0.5, "interaction_id": turn}, headers=tenant)
        assert r.status_code == 200 and r.json()["reward"] == 0.5
        await eventually(lambda: training.trainer.counts["received_feedback_samples"] == 1, what="the turn in the trainer")
        events = (await c.get("/v1/feedback", params={"conversation_id": "a"}, headers=tenant)).json()["data"]
        assert [e["value"] for e in events] == [0.5]  # the refused ones were never stored


async def test_the_outcome_range_is_the_operators(tokenizer, stop_ids, asgi_client):
    app, training, _ = wired(tokenizer, stop_ids, online={"outcome_low": 0.0, "outcome_high": 10.0},
                             train_batch=100)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        turn = await chat(c, tenant, [{"role": "user", "content": "hello"}], conversation="a")
        r = await c.post("/v1/feedback", json={"kind": "outcome", "value": -1, "interaction_id": turn}, headers=tenant)
        assert r.status_code == 400
        r = await c.post("/v1/feedback", json={"kind": "outcome", "value": 7, "interaction_id": turn}, headers=tenant)
        assert r.status_code == 200 and r.json()["reward"] == 7.0
        # the trainer and the canary take rewards clipped to [reward_low, reward_high] (default [-1, 1]), counted
        await eventually(lambda: training.trainer.pending_samples == 1, what="the turn in the trainer")
        assert training.trainer.pending[0].samples[0].reward == 1.0
        assert training.feedback.counts["rewards_clipped"] == 1 and training.canary.rewards[0].total == 1.0
    with pytest.raises(ValueError):
        from rlgate.config import OnlineConfig

        OnlineConfig(outcome_low=1.0, outcome_high=math.inf)


def test_samples_with_a_non_finite_reward_or_logprob_never_queue() -> None:
    async def publish() -> int | None:
        return None

    class Never:
        def step(self, samples, group_ids, current_version):  # pragma: no cover - must not be called
            raise AssertionError("stepped")

    t = OnlineTrainer(OnlineConfig(train_batch=1), Never(), publish)
    t.add_feedback(_sample("inf-reward", math.inf), "c", "tn", 0.0)
    t.add_feedback(_sample("nan-logprob", 1.0, logprob=math.nan), "c", "tn", 0.0)
    from rlgate.online.groups import LiveGroup

    t.add_group(LiveGroup("g", "c", "tn", [_sample("g0", 1.0), _sample("g1", math.nan)]))
    assert t.pending_samples == 0 and t.counts["dropped_nonfinite"] == 4
    assert asyncio.run(t.step_once()) is None


def test_a_judge_giving_nan_loses_its_group_and_big_scores_are_clipped(tokenizer) -> None:
    from rlgate.engine.base import SamplingParams
    from rlgate.engine.fake import FakeEngine
    from test_online_groups import _interaction

    async def main(scores: list[float]) -> tuple[list, LiveGroups]:
        got: list = []

        async def judge(samples):
            return scores

        groups = LiveGroups(OnlineConfig(group_fraction=1.0, group_size=3), FakeEngine(tokenizer, output_tokens=2),
                            judge, got.append, decode=tokenizer.decode)
        assert groups.offer(_interaction(tokenizer), SamplingParams(max_new_tokens=2), "c", "tn")
        await eventually(lambda: groups.in_flight == 0, what="the group")
        return got, groups

    got, groups = asyncio.run(main([0.5, math.nan, 1.0]))
    assert got == [] and groups.counts["nonfinite_reward"] == 1
    got, groups = asyncio.run(main([1e300, -5.0, 0.25]))
    assert [s.reward for s in got[0].samples] == [1.0, -1.0, 0.25] and groups.clipped_rewards == 2
    assert scorer_of  # (the per-sample form goes through the same check)


async def test_a_non_finite_step_is_discarded_alarmed_never_published_and_training_recovers(
        tiny_model_dir, tokenizer, stop_ids, asgi_client):
    """A real GRPO step (train/online.py on the tiny model) whose loss is not finite: samples with absurd but
    finite recorded logprobs (-1e30) pass the input check and, with ``grpo.proximal: recorded`` (the ratio
    taken against them), make the ratio overflow. The update is not applied, the step's samples are dropped,
    no candidate is offered, the nonfinite_steps guard fires; the next good step trains and publishes. (Under
    the default ``proximal: trainer`` the same samples weigh at most ``importance_cap``:
    test_train_loop.py's test_absurd_recorded_logprobs_weigh_at_most_the_cap.)"""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.train.online import build_online_training

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    options = OnlineConfig(train=True, lr=1e-2, train_batch=2, replay_fraction=1.0)
    from rlgate.train.config import GRPOConfig, OnlineTrainConfig

    training = build_online_training(model, options, tokenizer,
                                     train_config=OnlineTrainConfig(grpo=GRPOConfig(lr=1e-2, proximal="recorded")))
    trainer, engines = training.trainer, training.engines
    assert trainer is not None and engines is not None
    from helpers import ADMIN_KEY
    from rlgate.config import GatewayConfig
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engines, MemoryStore(), tokenizer,
                     stop_token_ids=stop_ids, online=OnlineConfig(online=True), online_training=training)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        trainer.add_feedback(_sample("poison-1", 1.0, logprob=-1e30, prompt=(5, 6)), "c1", "tn", time.time())
        trainer.add_feedback(_sample("poison-2", -1.0, logprob=-1e30, prompt=(5, 7)), "c2", "tn", time.time())
        await eventually(lambda: trainer.counts["nonfinite_steps"] == 1, what="the poisoned step")
        assert trainer.counts["dropped_nonfinite"] == 2 and trainer.counts["steps"] == 0
        assert trainer.counts["published"] == 0 and training.canary.canary_version is None
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no update applied
        assert not trainer.replay and trainer.pending_samples == 0
        health = (await c.get("/health")).json()
        assert any(d["guard"] == "nonfinite_steps" for d in health.get("degraded", [])), health
        metrics = (await c.get("/metrics", headers=admin_headers())).text
        assert 'rlgate_guard_firing{guard="nonfinite_steps"} 1.0' in metrics
        assert 'rlgate_online_train_samples_total{fate="dropped_nonfinite"} 2.0' in metrics
        # recovery: a good step trains, keeps the weights finite and offers them as a candidate
        trainer.add_feedback(_sample("good-1", 1.0, logprob=-2.0, prompt=(5, 6)), "c3", "tn", time.time())
        trainer.add_feedback(_sample("good-2", -1.0, logprob=-2.0, prompt=(5, 7)), "c4", "tn", time.time())
        await eventually(lambda: trainer.counts["published"] == 1, what="a good step, published")
        assert trainer.counts["steps"] == 1 and training.canary.canary_version == 1
        assert all(bool(torch.isfinite(v).all()) for v in model.state_dict().values())
        assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
