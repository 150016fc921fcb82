"""Feedback events: their values, the reward map, and the store that keeps and lists them."""

from __future__ import annotations

import sqlite3
import time

import pytest

from rlgate.config import OnlineConfig
from rlgate.online.reward_map import RewardMap, parse_weights
from rlgate.records.feedback import FeedbackEvent, check_value
from rlgate.store.base import MemoryStore
from rlgate.store.sqlite import SQLiteStore


def event(kind, value, *, t=0.0, turn="chatcmpl-1", conv="c1", tenant="tn-a", eid=None, source="explicit"):
    return FeedbackEvent(id=eid or f"fb-{kind}-{t}-{turn}-{conv}", tenant=tenant, conversation_id=conv,
                         interaction_id=turn, kind=kind, value=value, source=source, created_at=t)


@pytest.mark.parametrize(("kind", "value", "stored"), [
    ("thumbs", True, 1.0), ("thumbs", False, -1.0), ("thumbs", -1, -1.0), ("rating", 4, 4.0),
    ("preference", 1, 1.0), ("outcome", 0.25, 0.25), ("comment", "too long", "too long"),
    ("implicit", "regenerate", "regenerate"),
])
def test_values_by_kind(kind, value, stored):
    assert check_value(kind, value, max_comment_chars=100) == stored


@pytest.mark.parametrize(("kind", "value"), [
    ("thumbs", 0.5), ("rating", 0), ("rating", 6), ("rating", True), ("outcome", float("nan")),
    ("outcome", "1"), ("comment", ""), ("comment", "x" * 101), ("implicit", "sighs"), ("like", 1),
    ("preference", 0),
])
def test_bad_values_are_refused(kind, value):
    with pytest.raises(ValueError):
        check_value(kind, value, max_comment_chars=100)


def test_reward_map_defaults():
    rm = RewardMap.from_config(OnlineConfig())
    assert rm.reward([]) is None
    assert rm.reward([event("comment", "nice")]) is None  # a comment carries no reward
    assert rm.reward([event("thumbs", 1.0)]) == 1.0
    assert rm.reward([event("rating", 5.0)]) == 1.0 and rm.reward([event("rating", 2.0)]) == -0.5
    # a change of mind: the latest thumbs counts
    assert rm.reward([event("thumbs", 1.0, t=1), event("thumbs", -1.0, t=2)]) == -1.0
    assert rm.reward([event("thumbs", -1.0, t=2), event("thumbs", 1.0, t=1)]) == -1.0
    # implicit signals count each time, weighted by name; abandon weighs 0 by default
    assert rm.reward([event("implicit", "regenerate")]) == -1.0
    assert rm.reward([event("implicit", "abandon")]) is None
    assert rm.reward([event("thumbs", 1.0), event("implicit", "regenerate")]) == 0.0
    assert rm.reward([event("thumbs", 1.0), event("implicit", "edit")]) == pytest.approx(0.5 / 1.5)


def test_reward_map_from_config_weights_and_sum():
    rm = RewardMap.from_config(OnlineConfig(reward_weights=["thumbs=2", "abandon=-0.5"], reward_combine="sum"))
    assert rm.weights["thumbs"] == 2.0 and rm.weights["abandon"] == -0.5 and rm.weights["rating"] == 1.0
    assert rm.reward([event("thumbs", 1.0), event("implicit", "abandon"), event("outcome", 3.0)]) == 4.5


@pytest.mark.parametrize("item", ["thumbs", "likes=1", "thumbs=x", "thumbs=inf", "comment=1"])
def test_reward_weights_are_checked(item):
    with pytest.raises(ValueError):
        parse_weights([item])


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.sqlite")
    yield s
    s.close()


def test_store_lists_by_conversation_and_tails_with_a_cursor(store):
    a = event("thumbs", 1.0, t=1, conv="c1")
    b = event("rating", 4.0, t=2, conv="c2", turn=None)
    c = event("outcome", 1.0, t=3, conv="c1", source="delayed")
    other = event("thumbs", -1.0, t=4, conv="c1", tenant="tn-b")
    for e in (a, b, c, other):
        store.add_feedback(e)
    store.add_feedback(a)  # the same id again (an implicit signal seen twice): stored once
    assert store.list_feedback(tenant="tn-a", conversation_id="c1").events == [a, c]
    assert store.list_feedback(tenant="tn-a", interaction_id=None).events == [a, b, c]
    assert store.count_feedback(tenant="tn-a", conversation_id="c1") == 2
    first = store.list_feedback(limit=2)
    assert first.events == [a, b]
    rest = store.list_feedback(after=first.cursor)
    assert rest.events == [c, other]
    assert store.list_feedback(after=rest.cursor).events == []
    assert store.list_feedback(after=rest.cursor).cursor == rest.cursor
    late = event("outcome", 0.0, t=9, conv="c3", source="delayed")
    store.add_feedback(late)
    assert store.list_feedback(after=rest.cursor).events == [late]
    store.delete_feedback(tenant="tn-a", conversation_id="c1")
    assert store.list_feedback().events == [b, other, late]
    store.purge_feedback(before=5.0)
    assert store.list_feedback().events == [late]


def test_sqlite_feedback_survives_a_restart_and_deletion_leaves_no_row(tmp_path):
    path = tmp_path / "s.sqlite"
    store = SQLiteStore(path)
    e = FeedbackEvent(id="fb-1", tenant="tn-a", conversation_id="c1", interaction_id="msg_1", kind="preference",
                      value=1.0, source="explicit", created_at=5.0, policy_version=3,
                      metadata={"pair": "p1", "other": "msg_2"})
    store.add_feedback(e)
    store.close()
    store = SQLiteStore(path)
    assert store.list_feedback().events == [e]
    store.delete_feedback(tenant="tn-a")
    store.flush()
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 0
    store.close()


# --------------------------------------------------------------------------- the HTTP API

from helpers import ADMIN_KEY as ADMIN  # noqa: E402
from online_helpers import chat, new_tenant, online_app, reply_of  # noqa: E402

USER = [{"role": "user", "content": "write a haiku"}]


async def test_feedback_of_every_kind_over_http(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        first = await chat(c, tenant, USER, conversation="conv-1")
        again = await chat(c, tenant, USER, conversation="conv-1")  # the user regenerated
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": False, "interaction_id": first},
                         headers=tenant)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["conversation_id"] == "conv-1" and body["reward"] == -1.0 and body["tenant_id"] == tid
        r = await c.post("/v1/feedback", json={"kind": "preference", "value": 1, "interaction_id": again,
                                                "other_interaction_id": first}, headers=tenant)
        assert r.status_code == 200 and len(r.json()["ids"]) == 2 and r.json()["reward"] == 1.0
        r = await c.post("/v1/feedback", json={"kind": "rating", "value": 5, "conversation_id": "conv-1"},
                         headers=tenant)
        assert r.status_code == 200 and r.json()["interaction_id"] is None and r.json()["reward"] == 1.0
        r = await c.post("/v1/feedback", json={"kind": "comment", "value": "too long", "interaction_id": first},
                         headers=tenant)
        assert r.status_code == 200 and r.json()["reward"] is not None  # the comment adds nothing
        r = await c.post("/v1/feedback", json={"kind": "outcome", "value": 1.0, "conversation_id": "conv-1",
                                                "source": "delayed", "metadata": {"pr": "merged"}}, headers=tenant)
        assert r.status_code == 200
        events = (await c.get("/v1/feedback", params={"conversation_id": "conv-1"}, headers=tenant)).json()["data"]
        assert [(e["kind"], e["interaction_id"], e["value"], e["source"]) for e in events] == [
            ("thumbs", first, -1.0, "explicit"), ("preference", again, 1.0, "explicit"),
            ("preference", first, -1.0, "explicit"), ("rating", None, 5.0, "explicit"),
            ("comment", first, "too long", "explicit"), ("outcome", None, 1.0, "delayed")]
        assert events[1]["metadata"]["pair"] == events[2]["metadata"]["pair"]
        assert events[0]["policy_version"] == 0 and all(e["created_at"] > 0 for e in events)
        on = app.state.online
        assert on.reward(tid, "conv-1", first) == -1.0  # thumbs down, the other reply preferred
        assert on.reward(tid, "conv-1", None) == 1.0  # rating 5 and the outcome
        # the tail: two at a time, then what comes later
        page = (await c.get("/v1/feedback", params={"limit": 2}, headers=tenant)).json()
        rest = (await c.get("/v1/feedback", params={"after": page["cursor"]}, headers=tenant)).json()
        assert [e["id"] for e in page["data"] + rest["data"]] == [e["id"] for e in events]
        metrics = (await c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})).text
        assert 'rlgate_online_turns_with_feedback_total{policy_version="0"} 2.0' in metrics
        assert 'rlgate_feedback_events_total{kind="preference",source="explicit"} 2.0' in metrics


async def test_bad_feedback_gets_a_4xx_in_the_openai_shape(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, max_feedback_per_target=2)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        turn = await chat(c, tenant, USER)
        cases = [
            ({"kind": "like", "value": 1, "interaction_id": turn}, 400),
            ({"kind": "rating", "value": 7, "interaction_id": turn}, 400),
            ({"kind": "thumbs", "value": 0.5, "interaction_id": turn}, 400),
            ({"kind": "implicit", "value": "regenerate", "interaction_id": turn}, 400),
            ({"kind": "thumbs", "value": True, "interaction_id": turn, "surprise": 1}, 400),
            ({"kind": "thumbs", "value": True}, 400),
            ({"kind": "preference", "value": 1, "interaction_id": turn}, 400),
            ({"kind": "thumbs", "value": True, "interaction_id": "chatcmpl-nope"}, 404),
            ({"kind": "thumbs", "value": True, "conversation_id": "never"}, 404),
            ({"kind": "thumbs", "value": True, "interaction_id": turn, "conversation_id": "other"}, 400),
        ]
        for body, status in cases:
            r = await c.post("/v1/feedback", json=body, headers=tenant)
            assert r.status_code == status, (body, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
        r = await c.post("/v1/feedback", content=b"{not json", headers={**tenant, "content-type": "application/json"})
        assert r.status_code == 400
        for _ in range(2):
            assert (await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                                 headers=tenant)).status_code == 200
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                         headers=tenant)
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_much_feedback"


async def test_a_tenant_reaches_only_its_own_feedback(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        a_id, a = await new_tenant(c, "a")
        b_id, b = await new_tenant(c, "b")
        turn = await chat(c, a, USER, conversation="shared-name")
        await chat(c, b, USER, conversation="shared-name")
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn}, headers=b)
        assert r.status_code == 404  # b cannot even learn that a's turn exists
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn,
                                                "tenant_id": a_id}, headers=b)
        assert r.status_code == 403
        assert (await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                             headers=a)).status_code == 200
        assert (await c.get("/v1/feedback", headers=b)).json()["data"] == []
        assert (await c.get("/v1/feedback", params={"tenant_id": a_id}, headers=b)).status_code == 403
        r = await c.get("/v1/feedback", params={"tenant_id": a_id}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert [e["interaction_id"] for e in r.json()["data"]] == [turn]
        # the admin may post on any tenant's turn (a delayed outcome from a CI system)
        r = await c.post("/v1/feedback", json={"kind": "outcome", "value": 1, "interaction_id": turn,
                                                "source": "delayed"}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200 and r.json()["tenant_id"] == a_id


# --------------------------------------------------------------------------- implicit signals


async def test_implicit_signals(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, implicit_scan_interval=3600, abandon_after=60)
    on = app.state.online
    now = [time.time() + 1.0]  # the scanner's clock: a turn completed at time.time() is abandoned 60 s later
    on.implicit.clock = lambda: now[0]
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        first = await chat(c, tenant, USER, conversation="k")
        regen = await chat(c, tenant, USER, conversation="k")  # same request again
        follow = USER + [reply_of(app, regen), {"role": "user", "content": "shorter please"}]
        second = await chat(c, tenant, follow, conversation="k")
        edited = await chat(c, tenant, follow[:-1] + [{"role": "user", "content": "shorter!"}], conversation="k")
        # a tool call that failed (the tool result's text says so)
        calling = await chat(c, tenant, [{"role": "user", "content": "use the tool"}], conversation="t")
        r = await c.post("/v1/chat/completions", headers={**tenant, "X-Conversation-Id": "t"}, json={
            "model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "use the tool"}, reply_of(app, calling),
                {"role": "user", "content": "ran it"},
                {"role": "tool", "tool_call_id": "call_1", "content": "Error: division by zero"}]})
        assert r.status_code == 200
        on.implicit.scan()
        implicit = [(e.value, e.interaction_id) for e in on.records.list_feedback(tenant=tid).events]
        assert ("regenerate", first) in implicit
        assert ("edit", second) in implicit
        assert ("abandon", edited) not in implicit  # not yet: 60 s have not passed
        now[0] += 61
        on.implicit.scan()
        on.implicit.scan()  # once only
        events = on.records.list_feedback(tenant=tid).events
        implicit = [(e.value, e.interaction_id) for e in events]
        assert implicit.count(("abandon", edited)) == 1 and implicit.count(("regenerate", first)) == 1
        assert all(e.source == "implicit" and e.kind == "implicit" for e in events)
        assert on.reward(tid, "k", first) == -1.0  # the default weights: regenerate -1
        assert ("tool_error", calling) in implicit


async def test_the_viewer_shows_feedback_rate_and_reward_per_version(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, gateway={"ui": True}, implicit_scan_interval=3600)
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        liked = await chat(c, tenant, USER, conversation="a")
        await chat(c, tenant, USER, conversation="b")
        await c.post("/v1/feedback", json={"kind": "rating", "value": 4, "interaction_id": liked}, headers=tenant)
        on.implicit.scan()  # counts the turns
        r = await c.get("/ui/online", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200
        assert "<td>0</td><td>2</td><td>1</td><td>50.0%</td><td>1</td><td>+0.500</td>" in r.text
        assert (await c.get("/ui/online", follow_redirects=False)).status_code == 303  # no key: the login form
        assert (await c.get("/ui/online", headers=tenant, follow_redirects=False)).status_code == 303


async def test_implicit_signals_are_stored_once_across_a_restart(tokenizer, stop_ids, asgi_client, tmp_path):
    from rlgate.store.sqlite import SQLiteStore

    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path), implicit_scan_interval=3600)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        first = await chat(c, tenant, USER, conversation="r")
        await chat(c, tenant, USER, conversation="r")
        app.state.online.implicit.scan()
    app = online_app(tokenizer, stop_ids, SQLiteStore(path), implicit_scan_interval=3600)
    async with app.router.lifespan_context(app):
        app.state.online.implicit.scan()  # the restored turns are looked at again
        events = app.state.online.records.list_feedback(tenant=tid).events
    assert [(e.value, e.interaction_id) for e in events] == [("regenerate", first)]
