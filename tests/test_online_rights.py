"""Data rights (rlgate serve --online): deletion of a conversation or a tenant leaves no trace in the
store (the SQLite file queried directly), the exports or a pending batch (via the notifier);
retention by age; the redaction hook before anything reaches a trainer."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from helpers import admin_headers
from online_helpers import chat, new_tenant, online_app, reply_of
from rlgate.online.retention import purge_expired
from rlgate.online.rights import Deletion
from rlgate.store.sqlite import SQLiteStore

SECRET = "my card number is 4111-1111-1111-1111"


class PendingBatch:
    """A trainer's samples waiting for a step, as part 2's trainer holds them; it subscribes to deletions."""

    def __init__(self) -> None:
        self.samples: dict[str, dict] = {}  # interaction id -> sample
        self.deletions: list[Deletion] = []

    def on_delete(self, deletion: Deletion) -> None:
        self.deletions.append(deletion)
        for iid in deletion.interaction_ids:
            self.samples.pop(iid, None)


def db_rows(path: Path, sql: str, *params) -> list:
    with sqlite3.connect(path) as db:
        return db.execute(sql, params).fetchall()


def file_holds(directory: Path, text: str) -> bool:
    return any(text.encode() in p.read_bytes() for p in directory.iterdir() if p.name.startswith("s.sqlite"))


async def test_deleting_a_conversation_leaves_no_trace(tokenizer, stop_ids, asgi_client, tmp_path):
    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    on = app.state.online
    batch = PendingBatch()
    on.rights.notifier.on_delete(batch.on_delete)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        _, other_tenant = await new_tenant(c, "other")
        secret = [{"role": "user", "content": SECRET}]
        t1 = await chat(c, tenant, secret, conversation="private")
        t2 = await chat(c, tenant, secret + [reply_of(app, t1), {"role": "user", "content": "thanks"}],
                        conversation="private")
        kept = await chat(c, tenant, [{"role": "user", "content": "the weather"}], conversation="public")
        for turn in (t1, t2, kept):
            assert (await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                                 headers=tenant)).status_code == 200
        sid = on.conversations.find_turn(tid, t1)[0].id
        batch.samples = {t1: {"id": t1}, t2: {"id": t2}, kept: {"id": kept}}
        assert db_rows(path, "SELECT COUNT(*) FROM interactions WHERE session_id=?", sid) == [(2,)]
        # another tenant cannot delete it (nor learn it exists)
        r = await c.post("/v1/data/delete", json={"conversation_id": "private"}, headers=other_tenant)
        assert r.status_code == 404
        r = await c.post("/v1/data/delete", json={"conversation_id": "private"}, headers=tenant)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["interaction_ids"]) == sorted([t1, t2]) and r.json()["session_ids"] == [sid]
        # the store, queried directly once the 2xx came back: nothing of the conversation
        assert db_rows(path, "SELECT COUNT(*) FROM sessions WHERE id=?", sid) == [(0,)]
        assert db_rows(path, "SELECT COUNT(*) FROM interactions WHERE session_id=? OR id IN (?, ?)",
                       sid, t1, t2) == [(0,)]
        assert db_rows(path, "SELECT COUNT(*) FROM feedback WHERE conversation_id='private' "
                             "OR interaction_id IN (?, ?)", t1, t2) == [(0,)]
        assert db_rows(path, "SELECT COUNT(*) FROM feedback WHERE interaction_id=?", kept) == [(1,)]
        # the pending batch dropped it (the notifier), the other conversation stays
        assert set(batch.samples) == {kept} and batch.deletions[0].conversation_ids == ("private",)
        # exports: the session is gone
        r = await c.post("/export_trajectories", json={"session_id": sid, "keep": True}, headers=admin_headers())
        assert r.status_code == 404
        assert on.conversations.find_turn(tid, t1) is None
        r = await c.get("/v1/feedback", params={"conversation_id": "private"}, headers=tenant)
        assert r.json()["data"] == []
    # the file itself (closed, so checkpointed): the text is not left in a free page
    assert not file_holds(tmp_path, SECRET)
    assert file_holds(tmp_path, "the weather")


async def test_deleting_a_tree_of_the_shared_session_keeps_the_others(tokenizer, stop_ids, asgi_client, tmp_path):
    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        a1 = await chat(c, tenant, [{"role": "user", "content": SECRET}])
        b1 = await chat(c, tenant, [{"role": "user", "content": "unrelated question"}])
        a2 = await chat(c, tenant, [{"role": "user", "content": SECRET}, reply_of(app, a1),
                                    {"role": "user", "content": "and then?"}])
        b2 = await chat(c, tenant, [{"role": "user", "content": "unrelated question"}, reply_of(app, b1),
                                    {"role": "user", "content": "more"}])
        r = await c.post("/v1/data/delete", json={"conversation_id": a1}, headers=tenant)
        assert r.status_code == 200 and sorted(r.json()["interaction_ids"]) == sorted([a1, a2])
        assert r.json()["session_ids"] == []  # the shared session stays, with the other conversation
        ids = {row[0] for row in db_rows(path, "SELECT id FROM interactions")}
        assert ids == {b1, b2}
    assert not file_holds(tmp_path, SECRET)
    # the remaining tree reloads whole after a restart
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    found = app.state.online.conversations.find_turn(tid, b2)
    assert found is not None and found[1].parent_id == b1
    assert app.state.online.conversations.find_turn(tid, a2) is None
    app.state.gateway.store.close()


async def test_revoking_a_tenant_with_its_data(tokenizer, stop_ids, asgi_client, tmp_path):
    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    batch = PendingBatch()
    app.state.online.rights.notifier.on_delete(batch.on_delete)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        t1 = await chat(c, tenant, [{"role": "user", "content": SECRET}], conversation="x")
        t2 = await chat(c, tenant, [{"role": "user", "content": "shared-session turn"}])
        await c.post("/v1/feedback", json={"kind": "rating", "value": 2, "interaction_id": t2}, headers=tenant)
        batch.samples = {t1: {}, t2: {}}
        r = await c.post("/v1/tenants/revoke", json={"tenant_id": tid, "delete_data": True}, headers=admin_headers())
        assert r.status_code == 200 and r.json()["deleted"]["whole_tenant"] is True
        assert db_rows(path, "SELECT COUNT(*) FROM sessions") == [(0,)]
        assert db_rows(path, "SELECT COUNT(*) FROM interactions") == [(0,)]
        assert db_rows(path, "SELECT COUNT(*) FROM feedback") == [(0,)]
        assert db_rows(path, "SELECT COUNT(*) FROM tenants") == [(0,)]
        assert batch.samples == {}
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": [], "max_tokens": 2},
                         headers=tenant)
        assert r.status_code == 401
    assert not file_holds(tmp_path, SECRET)


async def test_retention_deletes_by_age(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, data_retention_hours=1.0)
    on = app.state.online
    batch = PendingBatch()
    on.rights.notifier.on_delete(batch.on_delete)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        old = await chat(c, tenant, [{"role": "user", "content": "old"}], conversation="old")
        await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": old}, headers=tenant)
        assert purge_expired(on.conversations, on.rights, on.records, 1.0) == 0  # nothing is an hour old yet
        later = time.time() + 3601
        new = await chat(c, tenant, [{"role": "user", "content": "new"}])
        on.conversations.find_turn(tid, new)[1].completed_at = later  # as if it came an hour later
        assert purge_expired(on.conversations, on.rights, on.records, 1.0, now=later) == 1
        assert on.conversations.find_turn(tid, old) is None and on.conversations.find_turn(tid, new) is not None
        assert on.records.list_feedback(tenant=tid).events == []
        assert [d.reason for d in batch.deletions] == ["retention"]


def redact_secret(sample: dict) -> dict | None:
    """A redaction hook (``--redaction-hook test_online_rights:redact_secret``): withholds any sample
    that mentions a card number."""
    return None if any("card number" in str(m.get("content")) for m in sample["messages"]) else sample


async def test_the_redaction_hook_runs_before_exports(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids, redaction_hook="test_online_rights:redact_secret")
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        await chat(c, tenant, [{"role": "user", "content": SECRET}], conversation="s")
        ok = await chat(c, tenant, [{"role": "user", "content": "fine"}], conversation="f")
        for conversation in ("s", "f"):
            (session, _), = on.conversations.turns_of(tid, conversation)
            app.state.gateway.sessions.end_session(session)
        r = await c.post("/rl/collect", json={"max_sessions": 10}, headers=admin_headers())
        exported = [i for s in r.json()["sessions"] for i in s["interactions"]]
        assert [i["id"] for i in exported] == [ok]


async def test_a_turn_being_generated_holds_its_deletion_back(tokenizer, stop_ids, asgi_client):
    import asyncio

    from helpers import eventually
    from rlgate.engine.fake import FakeEngine

    app = online_app(tokenizer, stop_ids, engine=FakeEngine(tokenizer, token_delay=0.05, output_tokens=40))
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        slow = asyncio.create_task(c.post("/v1/chat/completions", headers={**tenant, "X-Conversation-Id": "busy"},
                                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 40, "stream": True}))
        await eventually(lambda: any(s.in_flight for s in on.conversations.sessions_of(tid)), timeout=120,
                         what="the generation to start")
        r = await c.post("/v1/data/delete", json={"conversation_id": "busy"}, headers=tenant)
        assert r.status_code == 409 and r.json()["error"]["code"] == "generation_in_flight"
        assert (await slow).status_code == 200
        r = await c.post("/v1/data/delete", json={"conversation_id": "busy"}, headers=tenant)
        assert r.status_code == 200 and len(r.json()["interaction_ids"]) == 1


class FailingDeletes:
    """A store whose deletions fail to become durable (a full disk at the wrong moment)."""

    def __init__(self) -> None:
        from rlgate.store.base import MemoryStore

        self.inner = MemoryStore()
        self.fail = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def delete_session(self, session_id: str) -> int:
        return 7 if self.fail else 0

    def delete_interactions(self, session_id: str, ids) -> int:
        return 7 if self.fail else 0

    async def wait_durable(self, seqs) -> None:
        from rlgate.store.base import StoreError

        if 7 in seqs:
            raise StoreError("disk full")


async def test_a_deletion_the_store_refused_leaves_the_data_reachable(tokenizer, stop_ids, asgi_client):
    store = FailingDeletes()
    app = online_app(tokenizer, stop_ids, store)
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        named = await chat(c, tenant, [{"role": "user", "content": "a"}], conversation="n")
        tree = await chat(c, tenant, [{"role": "user", "content": "b"}])
        store.fail = True
        for conversation in ("n", tree):
            r = await c.post("/v1/data/delete", json={"conversation_id": conversation}, headers=tenant)
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        # still there, so that the client's retry deletes it
        assert on.conversations.find_turn(tid, named) is not None and on.conversations.find_turn(tid, tree) is not None
        store.fail = False
        for conversation in ("n", tree):
            assert (await c.post("/v1/data/delete", json={"conversation_id": conversation},
                                 headers=tenant)).status_code == 200
        assert on.conversations.find_turn(tid, named) is None and on.conversations.find_turn(tid, tree) is None


async def test_a_tenant_deletes_all_its_data_and_keeps_its_key(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids)
    on = app.state.online
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        other_id, other = await new_tenant(c, "other")
        kept = await chat(c, other, [{"role": "user", "content": "mine"}])
        await chat(c, tenant, [{"role": "user", "content": "a"}], conversation="a")
        t = await chat(c, tenant, [{"role": "user", "content": "b"}])
        await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": t}, headers=tenant)
        for body in ({}, {"all": True, "conversation_id": "a"}):
            r = await c.post("/v1/data/delete", json=body, headers=tenant)
            assert r.status_code == 400, r.text
        r = await c.post("/v1/data/delete", json={"all": True}, headers=tenant)
        assert r.status_code == 200 and r.json()["whole_tenant"] and len(r.json()["interaction_ids"]) == 2
        assert on.conversations.sessions_of(tid) == [] and on.records.list_feedback(tenant=tid).events == []
        assert on.conversations.find_turn(other_id, kept) is not None  # another tenant's data stays
        assert (await c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                           "max_tokens": 2}, headers=tenant)).status_code == 200
