"""The continuous trainer: batches as rewards arrive, staleness bounds, replay, deletion, publishing."""

from __future__ import annotations

import asyncio

import pytest

from helpers import eventually
from rlgate.config import OnlineConfig
from rlgate.online.groups import LiveGroup
from rlgate.online.trainer import OnlineTrainer
from rlgate.trajectory.sample import Sample


class Recorder:
    """A stepper that keeps what it was given (the real one is GRPOTrainer.step; see the torch test)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Sample], list[str], int]] = []

    def step(self, samples: list[Sample], group_ids: list[str], current_version: int) -> dict[str, float]:
        self.calls.append((samples, group_ids, current_version))
        return {"loss": 0.0}


def _sample(sid: str, reward: float, version: int = 0, prompt: tuple[int, ...] = (1, 2)) -> Sample:
    p = list(prompt)
    return Sample(id=sid, input_ids=p + [7, 8], loss_mask=[0] * len(p) + [1, 1], logprobs=[0.0] * len(p) + [-1.0, -1.0],
                  versions=[-1] * len(p) + [version, version], reward=reward)


def _trainer(now: list[float], published: list[int] | None = None, **kw: object) -> tuple[OnlineTrainer, Recorder]:
    rec = Recorder()
    versions = iter(range(1, 100))

    async def publish() -> int | None:
        if published is None:
            return None
        v = next(versions)
        published.append(v)
        return v

    return OnlineTrainer(OnlineConfig(**kw), rec, publish, clock=lambda: now[0]), rec  # type: ignore[arg-type]


def test_a_step_waits_for_a_batch_then_trains_groups_and_feedback() -> None:
    now = [1000.0]
    published: list[int] = []
    t, rec = _trainer(now, published, train_batch=6, replay_fraction=0.0)

    async def main() -> None:
        t.add_group(LiveGroup("g1", "conv-a", "tn", [_sample(f"g{i}", float(i)) for i in range(4)], created_at=now[0]))
        assert await t.step_once() is None  # 4 < 6 samples
        t.add_feedback(_sample("f1", 1.0, prompt=(3,)), "conv-b", "tn", now[0])
        t.add_feedback(_sample("f2", -1.0, prompt=(4,)), "conv-c", "tn", now[0])
        metrics = await t.step_once()
        assert metrics is not None and metrics["staleness_versions_max"] == 0

    asyncio.run(main())
    (samples, gids, version), = rec.calls
    assert [s.id for s in samples] == ["g0", "g1", "g2", "g3", "f1", "f2"] and version == 0
    # the live group keeps its id; lone feedback turns share one batch baseline
    assert gids == ["g1"] * 4 + ["feedback-batch"] * 2
    assert published == [1] and t.version == 1 and not t.dirty


def test_feedback_on_the_same_prompt_forms_a_group() -> None:
    now = [0.0]
    t, _ = _trainer(now)
    empty = t.batch_of([])
    assert empty.samples == [] and empty.group_ids == [] and empty.metrics()["samples"] == 0
    for i, p in enumerate([(1,), (1,), (2,)]):
        t.add_feedback(_sample(f"f{i}", 1.0, prompt=p), f"c{i}", None, now[0])
    batch = t.batch_of(list(t.pending))
    assert batch.group_ids == ["feedback-prompt-0", "feedback-prompt-0"]  # the lone one has no baseline: left out
    with pytest.raises(ValueError, match="no reward"):
        t.add_feedback(Sample(id="x", input_ids=[1], loss_mask=[1], logprobs=[0.0], versions=[0], reward=None), "c", None, 0)


def test_stale_samples_are_dropped_and_counted() -> None:
    now = [10_000.0]
    t, rec = _trainer(now, train_batch=2, max_staleness_versions=2, max_staleness_hours=1.0, replay_fraction=0.0)
    t.version = 5
    t.add_feedback(_sample("old-version", 1.0, version=2), "a", None, now[0])  # 3 versions behind
    t.add_feedback(_sample("old-hours", 1.0, version=5), "b", None, now[0] - 7200)  # 2 hours ago
    t.add_feedback(_sample("ok1", 1.0, version=4, prompt=(5,)), "c", None, now[0])
    t.add_feedback(_sample("ok2", 0.0, version=5, prompt=(6,)), "d", None, now[0])
    asyncio.run(t.step_once())
    (samples, _, version), = rec.calls
    assert [s.id for s in samples] == ["ok1", "ok2"] and version == 5
    assert t.counts["dropped_stale_versions"] == 1 and t.counts["dropped_stale_hours"] == 1
    # not published (a canary runs): the next step treats every sample as off-policy
    assert t.dirty and t.current_version == 6


def test_replay_mixes_in_trained_units_within_retention() -> None:
    now = [0.0]
    t, rec = _trainer(now, train_batch=2, replay_fraction=1.0, retention_hours=1.0)

    async def main() -> None:
        for k in range(3):
            t.add_feedback(_sample(f"a{k}", 1.0, prompt=(k, 1)), f"c{k}", None, now[0])
            t.add_feedback(_sample(f"b{k}", 0.0, prompt=(k, 2)), f"c{k}", None, now[0])
            await t.step_once()
            now[0] += 1500  # 25 minutes

    asyncio.run(main())
    ids = [[s.id for s in c[0]] for c in rec.calls]
    assert ids[0] == ["a0", "b0"]
    assert ids[1][:2] == ["a1", "b1"] and set(ids[1][2:]) == {"a0", "b0"}
    # at the third step the first batch is 50 minutes old and the second 25: retention keeps both (< 1 h)
    assert set(ids[2][2:]) <= {"a0", "b0", "a1", "b1"} and len(ids[2]) == 4
    assert t.counts["replayed_samples"] == 4


def test_deleted_conversations_and_tenants_leave_no_pending_or_replayed_sample() -> None:
    now = [0.0]
    t, rec = _trainer(now, train_batch=2, replay_fraction=1.0)

    async def main() -> None:
        t.add_feedback(_sample("keep1", 1.0, prompt=(1,)), "keep", "tn-keep", now[0])
        t.add_feedback(_sample("gone1", 0.0, prompt=(2,)), "gone", "tn-gone", now[0])
        await t.step_once()  # both trained, now in the replay buffer
        t.add_group(LiveGroup("g", "gone", "tn-gone", [_sample("gone2", 1.0), _sample("gone3", 0.0)]))
        t.add_feedback(_sample("other", 1.0, prompt=(3,)), "other", "tn-gone", now[0])
        assert t.forget(conversation="gone") == 3  # one replayable + a pending group of two
        assert t.forget(tenant="tn-gone") == 1
        t.add_feedback(_sample("keep2", 1.0, prompt=(4,)), "keep", "tn-keep", now[0])
        t.add_feedback(_sample("keep3", 0.0, prompt=(5,)), "keep", "tn-keep", now[0])
        await t.step_once()

    asyncio.run(main())
    trained = {s.id for c in rec.calls[1:] for s in c[0]}
    assert trained == {"keep2", "keep3", "keep1"} and t.counts["dropped_deleted"] == 4


def test_the_pending_queue_is_bounded() -> None:
    now = [0.0]
    t, _ = _trainer(now, pending_limit=3)
    for k in range(5):
        t.add_feedback(_sample(f"f{k}", 1.0), "c", None, now[0])
    assert t.pending_samples == 3 and t.counts["dropped_overflow"] == 2


# ---------------------------------------------------------------------------- wired into a gateway


def withhold_secrets(sample: dict) -> dict | None:
    """A redaction hook for the tests: withholds any sample whose messages mention "secret"."""
    return None if "secret" in str(sample["messages"]) else sample


def _wired(tokenizer, stop_ids, redaction: str | None = None, **opts: object):
    """An online gateway (fake engines: stable + spare) with online training; the stepper records."""
    from helpers import ADMIN_KEY
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.online.canary import Canary
    from rlgate.online.groups import LiveGroups, scorer_of
    from rlgate.online.training import OnlineTraining
    from rlgate.online.versions import TwoSlotEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    options = OnlineConfig(**opts)  # type: ignore[arg-type]
    canary = Canary(options)
    engines = TwoSlotEngine(FakeEngine(tokenizer, output_tokens=3), FakeEngine(tokenizer, output_tokens=3), canary)
    rec = Recorder()

    async def publish() -> int | None:
        return None

    trainer = OnlineTrainer(options, rec, publish)
    training = OnlineTraining(options, canary, engines, trainer, poll_interval=0.01)
    training.groups = LiveGroups(options, engines, scorer_of(lambda e: float(len(e.final_text))), training.add_group,
                                 decode=tokenizer.decode)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engines, MemoryStore(), tokenizer, stop_token_ids=stop_ids,
                     online=OnlineConfig(online=True, redaction_hook=redaction), online_training=training)
    return app, training, rec


async def test_feedback_and_live_groups_reach_the_trainer_and_deletion_removes_them(tokenizer, stop_ids, asgi_client):
    from helpers import admin_headers
    from online_helpers import chat, new_tenant

    app, training, rec = _wired(tokenizer, stop_ids, train_batch=1000, group_fraction=1.0, group_size=3)
    trainer = training.trainer
    assert trainer is not None
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        keep = await chat(c, tenant, [{"role": "user", "content": "keep me"}], conversation="keep")
        gone = await chat(c, tenant, [{"role": "user", "content": "forget me"}], conversation="gone")
        for turn in (keep, gone):
            r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                             headers=tenant)
            assert r.status_code == 200, r.text
        # two rewarded turns + two live groups of three
        await eventually(lambda: trainer.pending_samples == 8, what="feedback and groups in the trainer's queue")
        assert trainer.counts["received_feedback_samples"] == 2 and trainer.counts["received_group_samples"] == 6
        assert {u.conversation for u in trainer.pending} == {"keep", "gone"}
        assert training.canary.rewards[0].n == 2  # each rewarded turn credited to version 0 once
        r = await c.post("/v1/data/delete", json={"conversation_id": "gone"}, headers=tenant)
        assert r.status_code == 200, r.text
        assert {u.conversation for u in trainer.pending} == {"keep"} and trainer.counts["dropped_deleted"] == 4
        assert all(gone not in s.id for u in trainer.pending for s in u.samples)
        text = (await c.get("/metrics", headers=admin_headers())).text
        assert 'rlgate_online_train_samples_total{fate="dropped_deleted"} 4.0' in text
        assert 'rlgate_online_groups_total{outcome="completed"} 2.0' in text
        assert 'rlgate_online_version{role="stable"} 0.0' in text
    assert rec.calls == []  # train_batch not reached: nothing trained


def test_a_step_takes_at_most_train_batch_max_samples_oldest_first() -> None:
    now = [0.0]
    t, rec = _trainer(now, train_batch=2, train_batch_max=3, replay_fraction=0.0)
    for k in range(5):
        t.add_feedback(_sample(f"f{k}", float(k % 2), prompt=(k,)), f"c{k}", None, now[0])
    asyncio.run(t.step_once())
    assert [s.id for s in rec.calls[0][0]] == ["f0", "f1", "f2"] and t.pending_samples == 2


async def test_the_redaction_hook_sees_every_sample_before_the_trainer(tokenizer, stop_ids, asgi_client):
    from online_helpers import chat, new_tenant

    app, training, _ = _wired(tokenizer, stop_ids, "test_online_trainer:withhold_secrets", train_batch=1000,
                              group_fraction=1.0, group_size=2)
    trainer = training.trainer
    assert trainer is not None and training.feedback is not None
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        ok = await chat(c, tenant, [{"role": "user", "content": "plain"}], conversation="a")
        secret = await chat(c, tenant, [{"role": "user", "content": "my secret"}], conversation="b")
        for turn in (ok, secret):
            r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": False, "interaction_id": turn},
                             headers=tenant)
            assert r.status_code == 200, r.text
        await eventually(lambda: training.feedback is not None and training.feedback.counts["rewarded_turns"] == 2
                         and training.groups is not None and training.groups.in_flight == 0
                         and training.groups.counts["completed"] == 2, what="both turns read, both groups done")
        assert {s.id for u in trainer.pending for s in u.samples} >= {ok} and all(
            "secret" not in str(s.messages) for u in trainer.pending for s in u.samples)
        assert training.feedback.counts["withheld_by_redaction"] == 1 and training.withheld == 2


def test_conversation_ids_are_a_tenants_own_namespace() -> None:
    now = [0.0]
    t, _ = _trainer(now)
    t.add_feedback(_sample("a", 1.0), "chat-1", "tn-a", now[0])
    t.add_feedback(_sample("b", 1.0), "chat-1", "tn-b", now[0])
    assert t.forget(conversation="chat-1", tenant="tn-a") == 1
    assert [s.id for u in t.pending for s in u.samples] == ["b"]
    with pytest.raises(ValueError, match="forget what"):
        t.forget()


def test_a_candidate_every_candidate_steps() -> None:
    now = [0.0]
    published: list[int] = []
    t, _ = _trainer(now, published, train_batch=1, candidate_steps=3, replay_fraction=0.0)

    async def main() -> None:
        for k in range(6):
            t.add_feedback(_sample(f"f{k}", 1.0), "c", None, now[0])
            t.add_feedback(_sample(f"g{k}", 0.0, prompt=(9,)), "c", None, now[0])
            await t.step_once()

    asyncio.run(main())
    assert t.counts["steps"] == 6 and published == [1, 2]


def test_deleted_turns_leave_the_queue_whatever_their_conversation() -> None:
    now = [0.0]
    t, _ = _trainer(now)
    t.add_feedback(_sample("turn-1", 1.0), "c", None, now[0])
    t.add_group(LiveGroup("live-turn-2", "c", None, [_sample("turn-2", 1.0), _sample("turn-2-group1", 0.0)]))
    t.add_feedback(_sample("turn-3", 1.0), "c", None, now[0])
    assert t.forget_turns({"turn-1", "turn-2"}) == 3
    assert [s.id for u in t.pending for s in u.samples] == ["turn-3"]
