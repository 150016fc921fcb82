"""Feedback events: their values, the reward map, and the store that keeps and lists them."""

from __future__ import annotations

import sqlite3

import pytest

from rlgate.config import OnlineConfig
from rlgate.online.feedback import FeedbackEvent, check_value
from rlgate.online.reward_map import RewardMap, parse_weights
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
