"""Fair limits per tenant (issue 36, failure 2): one tenant's conversations, feedback or training samples cannot
refuse another tenant; idle conversations are released on a schedule that fits online traffic."""

from __future__ import annotations

import time

from online_helpers import chat, new_tenant, online_app
from rlgate.config import OnlineConfig
from rlgate.online.groups import LiveGroup
from rlgate.online.trainer import OnlineTrainer
from rlgate.trajectory.sample import Sample


async def test_one_tenant_filling_the_gateway_does_not_lock_out_another(tokenizer, stop_ids, asgi_client):
    """The issue's lockout: the global session limit filled by one tenant's conversations made every tenant,
    a new one included, get 429 too_many_sessions."""
    app = online_app(tokenizer, stop_ids, gateway={"max_sessions": 20})
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, busy = await new_tenant(c, "busy")
        for k in range(40):  # twice the gateway's limit: its own idle conversations make room
            await chat(c, busy, [{"role": "user", "content": f"hi {k}"}], conversation=f"user-{k}")
        _, quiet = await new_tenant(c, "quiet")
        await chat(c, quiet, [{"role": "user", "content": "hello"}], conversation="first")
        await chat(c, quiet, [{"role": "user", "content": "hello"}])  # its shared session too
        assert app.state.gateway.sessions.open_sessions() <= 20
        assert app.state.online.quotas.counts["released_for_room"] >= 22


async def test_a_tenant_at_its_open_limit_releases_its_own_idle_conversations(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, max_open_conversations_per_tenant=5)
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        for k in range(8):
            await chat(c, tenant, [{"role": "user", "content": f"hi {k}"}], conversation=f"c{k}")
        open_ = [s for s in on.conversations.sessions_of(tid) if s.status == "active"]
        assert len(open_) == 5 and on.quotas.counts["released_for_room"] == 3
        # the released ones are the least recently active: c0, c1, c2
        ended = sorted(s.metadata["conversation"] for s in on.conversations.sessions_of(tid) if s.status == "ended")
        assert ended == ["c0", "c1", "c2"]
        # a released conversation goes on in a new session
        await chat(c, tenant, [{"role": "user", "content": "back"}], conversation="c0")


async def test_held_conversations_and_stored_feedback_are_bounded_per_tenant(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, max_conversations_per_tenant=3, max_feedback_per_tenant=2)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, a = await new_tenant(c, "a")
        _, b = await new_tenant(c, "b")
        turns = [await chat(c, a, [{"role": "user", "content": "x"}], conversation=f"c{k}") for k in range(3)]
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "y"}]},
                         headers={**a, "X-Conversation-Id": "c3"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "tenant_conversations_full"
        await chat(c, b, [{"role": "user", "content": "x"}], conversation="c3")  # the other tenant is not refused
        for turn in turns[:2]:
            r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn}, headers=a)
            assert r.status_code == 200
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turns[2]}, headers=a)
        assert r.status_code == 429 and r.json()["error"]["code"] == "tenant_feedback_full"
        # deleting frees both: a conversation and its feedback
        assert (await c.post("/v1/data/delete", json={"conversation_id": "c0"}, headers=a)).status_code == 200
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turns[2]}, headers=a)
        assert r.status_code == 200
        await chat(c, a, [{"role": "user", "content": "x"}], conversation="c4")


async def test_idle_conversations_are_released_on_the_online_schedule(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, conversation_release_s=300)
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        await chat(c, tenant, [{"role": "user", "content": "x"}], conversation="old")
        await chat(c, tenant, [{"role": "user", "content": "x"}], conversation="new")
        old = next(s for s in on.conversations.sessions_of(tid) if s.metadata["conversation"] == "old")
        old.last_active -= 301
        assert on.quotas.release_idle() == 1 and old.status == "ended"
        assert [s.status for s in on.conversations.sessions_of(tid) if s is not old] == ["active"]


def _sample(sid: str, reward: float) -> Sample:
    return Sample(id=sid, input_ids=[1, sum(map(ord, sid)) % 50 + 3, 7], loss_mask=[0, 0, 1], logprobs=[0.0, 0.0, -1.0],
                  versions=[-1, -1, 0], reward=reward)


def test_one_tenant_takes_at_most_its_share_of_a_step_while_others_wait() -> None:
    async def publish() -> int | None:
        return None

    class Keep:
        calls: list[list[str]] = []

        def step(self, samples, group_ids, current_version):
            self.calls.append([s.id for s in samples])
            return {}

    import asyncio

    now = time.time()
    t = OnlineTrainer(OnlineConfig(train_batch=8, train_batch_max=8, tenant_train_share=0.5, replay_fraction=0.0),
                      Keep(), publish)
    for k in range(20):
        t.add_feedback(_sample(f"flood-{k}", float(k % 2)), f"f{k}", "tn-flood", now)
    for k in range(3):
        t.add_feedback(_sample(f"quiet-{k}", float(k % 2)), f"q{k}", "tn-quiet", now)
    asyncio.run(t.step_once())
    first = Keep.calls[0]
    assert sum(i.startswith("flood") for i in first) == 4 and sum(i.startswith("quiet") for i in first) == 3
    # alone in the queue, a tenant fills whole steps
    asyncio.run(t.step_once())
    assert len(Keep.calls[1]) == 8 and all(i.startswith("flood") for i in Keep.calls[1])


def test_an_overflowing_queue_drops_the_heaviest_tenants_samples() -> None:
    async def publish() -> int | None:
        return None

    t = OnlineTrainer(OnlineConfig(pending_limit=6), object(), publish)  # type: ignore[arg-type]
    now = time.time()
    t.add_feedback(_sample("quiet-0", 1.0), "q", "tn-quiet", now)
    t.add_group(LiveGroup("g", "q", "tn-quiet", [_sample("quiet-1", 1.0), _sample("quiet-2", 0.0)], created_at=now))
    for k in range(10):
        t.add_feedback(_sample(f"flood-{k}", 1.0), f"f{k}", "tn-flood", now)
    ids = [s.id for u in t.pending for s in u.samples]
    assert ids[:3] == ["quiet-0", "quiet-1", "quiet-2"] and len(ids) == 6
    assert t.counts["dropped_overflow"] == 7
