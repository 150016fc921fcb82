"""Tenants (rlgate serve --online): keys made and revoked by the admin, stored hashed, reaching only
their own conversations; conversations from a header or by parent matching."""

from __future__ import annotations

import sqlite3

from helpers import admin_headers, key_headers, start_session
from online_helpers import chat, new_tenant, online_app, reply_of
from rlgate.store.sqlite import SQLiteStore

USER = [{"role": "user", "content": "hello there"}]


async def test_a_tenant_key_is_shown_once_and_stored_hashed(tokenizer, stop_ids, asgi_client, tmp_path):
    store = SQLiteStore(tmp_path / "s.sqlite")
    app = online_app(tokenizer, stop_ids, store)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        r = await c.post("/v1/tenants", json={"name": "acme"}, headers=admin_headers())
        key = r.json()["api_key"]
        assert key.startswith("rlg-tenant-") and len(key) > 40
        listed = (await c.get("/v1/tenants", headers=admin_headers())).json()["data"]
        assert [t["name"] for t in listed] == ["acme"] and "api_key" not in listed[0]
        assert key not in (await c.get("/v1/tenants", headers=admin_headers())).text
    files = [p for p in tmp_path.iterdir() if p.name.startswith("s.sqlite")]
    assert files and all(key.encode() not in p.read_bytes() for p in files)
    rows = sqlite3.connect(tmp_path / "s.sqlite").execute("SELECT name, key_hash FROM tenants").fetchall()
    assert len(rows) == 1 and rows[0][0] == "acme" and len(rows[0][1]) == 64
    # a restart knows the tenant by its digest
    app = online_app(tokenizer, stop_ids, SQLiteStore(tmp_path / "s.sqlite"))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        assert (await c.post("/v1/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 2},
                             headers=key_headers(key))).status_code == 200


async def test_what_a_tenant_key_reaches(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        r = await c.get("/v1/models", headers=tenant)  # what SDKs call first: no session is started for it
        assert r.status_code == 200 and not app.state.online.conversations.sessions_of(tid)
        assert (await c.post("/v1/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 2},
                             headers=tenant)).status_code == 200
        r = await c.post("/v1/messages", json={"model": "m", "messages": USER, "max_tokens": 2}, headers=tenant)
        assert r.status_code == 200 and r.json()["type"] == "message"
        for path in ("/v1/tenants", "/v1/tenants/revoke", "/rl/start_session", "/rl/set_reward",
                     "/export_trajectories", "/rl/end_session"):
            r = await c.post(path, json={}, headers=tenant)
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["type"] == "permission_error"
        # no key, an unknown key, a harness session's key on the online routes
        _, session_key = await start_session(c)
        for headers in ({}, key_headers("rlg-tenant-not-a-key-0123456789abcdef"), key_headers(session_key)):
            r = await c.post("/v1/feedback", json={"kind": "comment", "value": "x", "conversation_id": "c"},
                             headers=headers)
            assert r.status_code == 401, r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        # revoked: refused at once
        r = await c.post("/v1/tenants/revoke", json={"tenant_id": tid}, headers=admin_headers())
        assert r.status_code == 200 and r.json()["revoked_at"] is not None
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 2},
                         headers=tenant)
        assert r.status_code == 401


async def test_conversations_by_header_and_by_parent_matching(tokenizer, stop_ids, asgi_client):
    app = online_app(tokenizer, stop_ids)
    conv = app.state.online.conversations
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        a_id, a = await new_tenant(c, "a")
        b_id, b = await new_tenant(c, "b")
        # the same header value from two tenants: two conversations, one session each
        t1 = await chat(c, a, USER, conversation="chat-1")
        t2 = await chat(c, b, USER, conversation="chat-1")
        (sa, _), (sb, _) = conv.find_turn(a_id, t1), conv.find_turn(b_id, t2)
        assert sa is not sb and sa.metadata == {"tenant": a_id, "conversation": "chat-1"}
        assert conv.find_turn(b_id, t1) is None  # b cannot reach a's turn
        follow = USER + [reply_of(app, t1), {"role": "user", "content": "more"}]
        t3 = await chat(c, a, follow, conversation="chat-1")
        s3, turn3 = conv.find_turn(a_id, t3)
        assert s3 is sa and turn3.parent_id == t1 and conv.conversation_of(s3, turn3) == "chat-1"
        # no header: one shared session, conversations are its trees (named by their first turn)
        u1 = await chat(c, a, [{"role": "user", "content": "first topic"}])
        u2 = await chat(c, a, [{"role": "user", "content": "second topic"}])
        u3 = await chat(c, a, [{"role": "user", "content": "first topic"}, reply_of(app, u1),
                               {"role": "user", "content": "go on"}])
        shared, turn_u3 = conv.find_turn(a_id, u3)
        assert shared is conv.find_turn(a_id, u2)[0] and shared.metadata["conversation"] is None
        assert turn_u3.parent_id == u1 and conv.conversation_of(shared, turn_u3) == u1
        assert conv.conversation_of(shared, shared.interactions[u2]) == u2
        assert {s.id for s in conv.sessions_of(a_id)} == {sa.id, shared.id}
        # a header value that could not be sent back or logged safely
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 2},
                         headers={**a, "X-Conversation-Id": "x" * 300})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_conversation_id"


async def test_an_exported_conversation_leaves_the_tenant(tokenizer, stop_ids, asgi_client):
    """A trainer that exports a tenant's session (without keep) takes it: the tenant's map forgets it,
    and its next turn starts a new session."""
    app = online_app(tokenizer, stop_ids)
    conv = app.state.online.conversations
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        tid, tenant = await new_tenant(c)
        turn = await chat(c, tenant, USER, conversation="x")
        session, _ = conv.find_turn(tid, turn)
        app.state.gateway.sessions.end_session(session)
        r = await c.post("/export_trajectories", json={"session_id": session.id}, headers=admin_headers())
        assert r.status_code == 200 and [i["id"] for i in r.json()["interactions"]] == [turn]
        assert conv.sessions_of(tid) == [] and conv.find_turn(tid, turn) is None
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                         headers=tenant)
        assert r.status_code == 404
        again = await chat(c, tenant, USER, conversation="x")
        assert conv.find_turn(tid, again)[0] is not session  # (its id may be reused: the core names sessions so)
