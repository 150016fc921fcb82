"""The SQLite store: exact round trip, restart semantics, delta encoding, files, failures."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import stat

import pytest

from helpers import ADMIN_KEY, admin_headers, key_headers, start_session
from rlgate.chat.conversation import message_to_openai
from rlgate.engine.fake import FakeEngine
from rlgate.store import open_store
from rlgate.store.base import MemoryStore, StoreError
from rlgate.store.sqlite import SQLiteStore, StoreLocked, decode_floats, decode_ints, encode_floats, encode_ints
from wire import chat

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TRANSIENT = {"prefix_index", "covered_lengths", "digest_memo", "in_flight", "render_cache"}


def persisted(obj) -> dict:
    """Every persisted field of a Session / Interaction, messages in their export form."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.name in TRANSIENT or f.name == "interactions":
            continue
        v = getattr(obj, f.name)
        if f.name == "messages":
            v = [message_to_openai(m) for m in v]
        elif f.name == "output_message":
            v = message_to_openai(v) if v is not None else None
        elif f.name == "tools":
            v = [dataclasses.asdict(t) for t in v]
        out[f.name] = v
    return out


async def export(c, sid, **kw):
    return await c.post("/export_trajectories", json={"session_id": sid, **kw}, headers=admin_headers())


def test_token_encoding_round_trips_exactly():
    ids = [0, 1, 151643, 2**31 - 1, -1]
    assert decode_ints(encode_ints(ids)) == ids and len(encode_ints(ids)) == 4 * len(ids)
    lps = [-0.0, -1e-300, -3.141592653589793, -123.456789012345678, float("-inf")]
    assert decode_floats(encode_floats(lps)) == lps


async def _populate(c, engine_script_len=0):
    """One ended multi-surface session with tools, images, reasoning and a fork; one active session."""
    sid, key = await start_session(c, "rt", metadata={"seed": 7, "tags": ["a", "ü"]})
    messages = [{"role": "system", "content": "Be exact."},
                {"role": "user", "content": [{"type": "text", "text": "Look: "},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    r = await chat(c, key, messages, tools=TOOLS, temperature=0.5, seed=3)
    msg = r["choices"][0]["message"]
    messages += [{k: v for k, v in msg.items() if v is not None and k != "refusal"},
                 {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "3"}]
    await chat(c, key, messages, tools=TOOLS)
    await chat(c, key, [{"role": "user", "content": "a side request"}])  # fork
    r = await c.post("/v1/responses", json={"input": "and via responses", "max_output_tokens": 5},
                     headers=key_headers(key))
    assert r.status_code == 200
    r = await c.post("/v1/messages", json={"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                     headers=key_headers(key))
    assert r.status_code == 200
    assert (await c.post("/rl/set_reward", json={"reward": 0.25}, headers=key_headers(key))).status_code == 200
    await c.post("/rl/end_session", headers=key_headers(key))
    sid2, key2 = await start_session(c, "live")
    await chat(c, key2, [{"role": "user", "content": "turn one"}])
    return sid, key, sid2, key2


async def test_restart_round_trips_everything(make_app, asgi_client, tokenizer, tmp_path):
    path = tmp_path / "gw.sqlite"
    engine = FakeEngine(tokenizer, script=[CALL, "Three.", "side", "resp", "msg", "live"])
    store = SQLiteStore(path)
    app = make_app(engine, store=store, capacity_mode="granted")
    async with asgi_client(app) as c:
        for _ in range(3):
            await c.post("/grant_capacity", headers=admin_headers())
        sid, key, sid2, key2 = await _populate(c)
        before = {style: (await export(c, sid, style=style, keep=True, discount=0.5)).json()
                  for style in ("individual", "concat")}
        old = {s.id: s for s in app.state.gateway.sessions.sessions.values()}
    store.close()

    store2 = SQLiteStore(path)
    app2 = make_app(FakeEngine(tokenizer), store=store2, capacity_mode="granted")
    mgr = app2.state.gateway.sessions
    assert mgr.capacity == 1  # 3 granted, 2 consumed
    assert set(mgr.sessions) == {sid, sid2}
    for s_id, s in old.items():
        new = mgr.sessions[s_id]
        exp = persisted(s)
        got = persisted(new)
        if s.status == "active":  # what a restart changes
            assert got.pop("status") == "interrupted" and exp.pop("status") == "active"
            assert got.pop("ended_at") is not None and exp.pop("ended_at") is None
        exp.pop("last_active"), got.pop("last_active")
        assert got == exp
        assert list(new.interactions) == list(s.interactions)
        for iid, i in s.interactions.items():
            assert persisted(new.interactions[iid]) == persisted(i), iid
    async with asgi_client(app2) as c:
        for style in ("individual", "concat"):
            r = await export(c, sid, style=style, keep=True, discount=0.5)
            assert r.json() == before[style]
        # the ended session's key: 409; the interrupted one's: 410; both stay exportable
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                         headers=key_headers(key))
        assert r.status_code == 409
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                         headers=key_headers(key2))
        assert r.status_code == 410 and r.json()["error"]["code"] == "session_interrupted"
        r = await c.post("/v1/messages", json={"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
                         headers=key_headers(key2))
        assert r.status_code == 410 and r.json()["type"] == "error"
        r = await export(c, sid2)
        assert r.status_code == 200 and r.json()["status"] == "interrupted" and len(r.json()["interactions"]) == 1
        # a continued chain on a new session extends the restored conversation index
        sid3, key3 = await start_session(c, "after")
        await chat(c, key3, [{"role": "user", "content": "new"}])
    store2.close()


async def test_restart_fails_pending_and_keeps_completed(make_app, asgi_client, tokenizer, tmp_path):
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    app = make_app(FakeEngine(tokenizer), store=store)
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        await chat(c, key, [{"role": "user", "content": "done"}])
    # a generation that started and never finished (the gateway died mid-stream)
    mgr = app.state.gateway.sessions
    session = mgr.sessions[sid]
    from rlgate.trajectory.interaction import Interaction

    mgr.add_interaction(session, Interaction(id="chatcmpl-pending", session_id=sid, api="chat", messages=[],
                                             tools=[], prompt_ids=[1, 2, 3]))
    store.close()
    store2 = SQLiteStore(path)
    app2 = make_app(FakeEngine(tokenizer), store=store2)
    async with asgi_client(app2) as c:
        exp = (await export(c, sid)).json()
        assert exp["stats"]["completed"] == 1 and exp["stats"]["failed"] == 1 and exp["status"] == "interrupted"
    assert app2.state.gateway.sessions.sessions.get(sid) is None  # exported without keep: gone
    store2.close()
    store3 = SQLiteStore(path)
    assert store3.load() == []  # and gone from the file
    store3.close()


async def test_export_removes_from_the_store_unless_kept_or_retained(make_app, asgi_client, tokenizer, tmp_path):
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    async with asgi_client(make_app(FakeEngine(tokenizer), store=store)) as c:
        ids = {}
        for name in ("drop", "keep"):
            sid, key = await start_session(c, name)
            await chat(c, key, [{"role": "user", "content": name}])
            await c.post("/rl/end_session", headers=key_headers(key))
            ids[name] = sid
        assert (await export(c, ids["drop"])).status_code == 200
        assert (await export(c, ids["keep"], keep=True)).status_code == 200
    store.flush()
    rows = sqlite3.connect(path).execute("SELECT id FROM sessions").fetchall()
    assert rows == [(ids["keep"],)]
    store.close()

    # --retain-exported: kept for audit (key retired, export 404), purged by the sweeper later
    path2 = tmp_path / "audit.sqlite"
    store = SQLiteStore(path2)
    app = make_app(FakeEngine(tokenizer), store=store, retain_exported=3600)
    async with asgi_client(app) as c:
        sid, key = await start_session(c, "audit")
        await chat(c, key, [{"role": "user", "content": "x"}])
        await c.post("/rl/end_session", headers=key_headers(key))
        assert (await export(c, sid)).status_code == 200
        assert (await export(c, sid)).status_code == 404
        r = await c.post("/rl/set_reward", json={"reward": 1, "session_id": sid}, headers=admin_headers())
        assert r.status_code == 404
        assert (await chat_status(c, key)) == 401
    store.close()
    store = SQLiteStore(path2)
    app = make_app(FakeEngine(tokenizer), store=store, retain_exported=3600)
    mgr = app.state.gateway.sessions
    assert mgr.sessions[sid].exported_at is not None  # still there for audit after a restart
    async with asgi_client(app) as c:
        assert (await chat_status(c, key)) == 401  # key stays retired
        assert (await export(c, sid)).status_code == 404
    mgr.sweep(now=mgr.sessions[sid].exported_at + 3601)
    assert sid not in mgr.sessions
    store.close()
    store = SQLiteStore(path2)
    assert store.load() == []
    store.close()


async def chat_status(c, key) -> int:
    r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                     headers=key_headers(key))
    return r.status_code


async def test_export_is_deleted_only_after_the_response(make_app, asgi_client, tokenizer, tmp_path):
    """At-least-once: while the export response is being built/sent the row is still on disk."""
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    app = make_app(FakeEngine(tokenizer), store=store)
    seen = []

    class Probe:  # ASGI middleware outside the app: looks at the file when the response starts
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            async def probe_send(message):
                if message["type"] == "http.response.start" and scope["path"] == "/export_trajectories":
                    store.flush()
                    seen.append(sqlite3.connect(path).execute("SELECT count(*) FROM sessions").fetchone()[0])
                await send(message)

            await self.inner(scope, receive, probe_send)

    async with asgi_client(Probe(app)) as c:
        sid, key = await start_session(c)
        await chat(c, key, [{"role": "user", "content": "x"}])
        await c.post("/rl/end_session", headers=key_headers(key))
        # a new session started while the export is in progress must not take the row
        assert (await export(c, sid)).status_code == 200
        sid_again, _ = await start_session(c)
        assert sid_again == sid  # the id is free again once the export was sent
    store.flush()
    assert seen == [1]
    assert sqlite3.connect(path).execute("SELECT id, status FROM sessions").fetchall() == [(sid, "active")]
    store.close()


async def test_delta_encoding_stores_each_turn_once(make_app, asgi_client, tokenizer, tmp_path):
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    app = make_app(FakeEngine(tokenizer, output_tokens=20), store=store)
    turns = 30
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        messages = [{"role": "system", "content": "You are a careful assistant. " * 10}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"question number {t}: what comes next?"})
            r = await chat(c, key, messages, tools=TOOLS)
            messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
        await c.post("/rl/end_session", headers=key_headers(key))
        before = (await export(c, sid, keep=True, style="concat")).json()
    store.flush()
    db = sqlite3.connect(path)
    stored_ids = db.execute("SELECT sum(length(prompt_ids)) / 4 FROM interactions").fetchone()[0]
    full_ids = sum(len(i.prompt_ids) for i in app.state.gateway.sessions.sessions[sid].interactions.values())
    stored_msgs = db.execute("SELECT sum(length(messages)) FROM interactions").fetchone()[0]
    null_tools = db.execute("SELECT count(*) FROM interactions WHERE tools IS NULL").fetchone()[0]
    assert null_tools == turns - 1
    assert stored_ids * 8 < full_ids, (stored_ids, full_ids)  # O(turns), not O(turns^2)
    full_msgs = sum(len(json.dumps([message_to_openai(m) for m in i.messages]))
                    for i in app.state.gateway.sessions.sessions[sid].interactions.values())
    assert stored_msgs * 5 < full_msgs
    order = list(app.state.gateway.sessions.sessions[sid].interactions)
    store.close()
    store = SQLiteStore(path)
    app2 = make_app(FakeEngine(tokenizer), store=store)
    assert list(app2.state.gateway.sessions.sessions[sid].interactions) == order
    store.close()
    # a base stored after its extensions (cannot happen, but the loader must not depend on it)
    db = sqlite3.connect(path)
    db.execute("UPDATE interactions SET seq = seq + 1000, rowid = rowid + 1000 WHERE id = ?", (order[0],))
    db.commit()
    db.close()
    store = SQLiteStore(path)
    app2 = make_app(FakeEngine(tokenizer), store=store)
    assert list(app2.state.gateway.sessions.sessions[sid].interactions) == order[1:] + order[:1]
    async with asgi_client(app2) as c:
        assert (await export(c, sid, keep=True, style="concat")).json() == before
    store.close()


def test_files_are_private_and_locked(tmp_path):
    d = tmp_path / "data"
    store = open_store(None, data_dir=d)
    assert isinstance(store, SQLiteStore) and store.path == d / "rlgate.sqlite"
    from rlgate.trajectory.interaction import Session

    store.save_session(Session(id="t-0", task_id="t", key_hash="0" * 64))
    store.flush()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for name in ("rlgate.sqlite", "rlgate.sqlite-wal", "rlgate.sqlite-shm", "rlgate.sqlite.lock"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, name
    with pytest.raises(StoreLocked):
        SQLiteStore(d / "rlgate.sqlite")
    store.close()
    store.close()  # idempotent
    SQLiteStore(d / "rlgate.sqlite").close()  # the lock is released on close
    assert isinstance(open_store(":memory:"), MemoryStore)


def test_loose_permissions_are_tightened(tmp_path):
    path = tmp_path / "x.sqlite"
    path.touch()
    os.chmod(path, 0o644)
    SQLiteStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "x.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteStore(path)


async def test_a_failed_write_answers_503_and_spares_the_others(make_app, asgi_client, tokenizer, tmp_path):
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    # a real SQLite failure for one kind of row (think: a full disk for that write)
    db = sqlite3.connect(path)
    db.execute("CREATE TRIGGER poison BEFORE INSERT ON sessions WHEN NEW.task_id = 'poison' "
               "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    db.commit()
    db.close()
    async with asgi_client(make_app(FakeEngine(tokenizer), store=store)) as c:
        r = await c.post("/rl/start_session", json={"task_id": "poison"}, headers=admin_headers())
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        assert "disk says no" in r.json()["error"]["message"]
        sid, key = await start_session(c, "fine")  # the store keeps serving other writes
        await chat(c, key, [{"role": "user", "content": "x"}])
    store.flush()
    assert store.stats["failed_writes"] == 1
    assert [s.id for s in store.load()] == [sid]
    store.close()


async def test_keys_are_never_written_to_the_store(make_app, asgi_client, tokenizer, tmp_path):
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    own_key = "my-own-session-key-" + "z" * 30
    async with asgi_client(make_app(FakeEngine(tokenizer), store=store)) as c:
        _, key = await start_session(c)
        await start_session(c, "own", api_key=own_key)
        await chat(c, key, [{"role": "user", "content": "x"}])
        await c.post("/rl/set_reward", json={"reward": 1}, headers=key_headers(key))
    store.close()
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    for secret in (key, own_key, ADMIN_KEY):
        assert secret.encode() not in blob


async def test_memory_store_has_the_same_interface(make_app, asgi_client):
    store = MemoryStore()
    assert store.save_meta("capacity", 1) == 0  # nothing to wait for
    await store.wait_durable([0])
    assert store.load_meta() == {} and store.load() == []
    store.flush()
    store.close()


async def test_the_barrier_waits_for_the_writes_it_is_given(tmp_path):
    """Writes are numbered; a request waits for its own numbers and fails only if one of them failed."""
    import asyncio

    from rlgate.trajectory.interaction import Session

    path = tmp_path / "a.sqlite"
    a = SQLiteStore(path)
    db = sqlite3.connect(path)
    db.execute("CREATE TRIGGER poison BEFORE INSERT ON sessions WHEN NEW.task_id = 'poison' "
               "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    db.commit()
    db.close()
    first = a.save_session(Session(id="t-0", task_id="t", key_hash="0" * 64))
    bad = a.save_session(Session(id="p-0", task_id="poison", key_hash="1" * 64))
    last = a.save_session(Session(id="t-1", task_id="t", key_hash="2" * 64))
    assert 0 < first < bad < last
    await asyncio.wait_for(a.wait_durable([first, last]), 5)  # the failure in between is not theirs
    with pytest.raises(StoreError, match="disk says no"):
        await asyncio.wait_for(a.wait_durable([bad]), 5)
    with pytest.raises(ValueError):
        await a.wait_durable([last + 1])  # not a write of this store
    assert sorted(s.id for s in a.load()) == ["t-0", "t-1"]
    a.close()
    late = a.save_session(Session(id="t-2", task_id="t", key_hash="3" * 64))  # after close: dropped
    with pytest.raises(StoreError, match="closed"):
        await a.wait_durable([late])



async def test_a_turn_completed_before_its_commit_is_written_as_one_row(tmp_path):
    """An interaction inserted and completed in the same event-loop iteration (a non-streamed
    reply from a fast engine) is one INSERT of its final row, not an INSERT and an UPDATE; both
    sequence numbers are durable together, and fail together if that row cannot be written."""
    import asyncio

    from rlgate.chat.conversation import Message, TextPart
    from rlgate.trajectory.interaction import Interaction, Session

    async def open_with_session(path):
        store = SQLiteStore(path)
        await store.wait_durable([store.save_session(Session(id="s-0", task_id="s", key_hash="0" * 64))])
        return store

    def turn(store, iid: str, finish: str) -> tuple[Interaction, list[int]]:
        i = Interaction(id=iid, session_id="s-0", api="chat", messages=[Message("user", [TextPart("hi")])],
                        tools=[], prompt_ids=[1, 2, 3])
        seqs = [store.save_interaction(i)]  # pending
        i.output_ids, i.output_logprobs, i.output_versions = [7, 8], [-0.5, -0.25], [3, 3]
        i.finish_reason, i.stop_kind, i.status, i.completed_at = finish, "stop_token", "completed", 1.0
        i.output_message = Message("assistant", [TextPart("ok")])
        seqs.append(store.save_interaction(i))  # completed, still in the same iteration
        return i, seqs

    path = tmp_path / "fold.sqlite"
    store = await open_with_session(path)
    statements: list[str] = []
    store._commits.conn.set_trace_callback(statements.append)
    done, seqs = turn(store, "chatcmpl-1", "stop")
    await asyncio.wait_for(store.wait_durable(seqs), 30)
    assert [s.split(" ")[0] for s in statements if s.startswith(("INSERT", "UPDATE"))] == ["INSERT"]
    done.reward = 1.0  # a change after the commit is an UPDATE again
    statements.clear()
    await asyncio.wait_for(store.wait_durable([store.save_interaction(done)]), 30)
    assert [s.split(" ")[0] for s in statements if s.startswith(("INSERT", "UPDATE"))] == ["UPDATE"]
    store.close()
    (s,) = SQLiteStore(path).load()
    (i,) = s.interactions.values()
    assert persisted(i) == persisted(done)

    path = tmp_path / "poison.sqlite"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("CREATE TRIGGER poison BEFORE INSERT ON interactions WHEN NEW.finish_reason = 'poison' "
               "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    db.commit()
    db.close()
    store = await open_with_session(path)
    _, bad = turn(store, "chatcmpl-2", "poison")  # the folded row fails: so do both of its changes
    for seq in bad:
        with pytest.raises(StoreError, match="disk says no"):
            await asyncio.wait_for(store.wait_durable([seq]), 30)
    good, seqs = turn(store, "chatcmpl-3", "stop")  # and the store goes on
    await asyncio.wait_for(store.wait_durable(seqs), 30)
    store.close()
    (s,) = SQLiteStore(path).load()
    assert [persisted(i) for i in s.interactions.values()] == [persisted(good)]

def test_cli_store_options(tiny_tokenizer_dir, tmp_path, monkeypatch):
    import argparse

    from rlgate.cli import add_serve_args, build_app

    monkeypatch.delenv("RLGATE_STORE", raising=False)  # conftest sets it for `rlgate serve` subprocesses
    p = argparse.ArgumentParser()
    add_serve_args(p)
    base = ["--model", str(tiny_tokenizer_dir), "--engine", "fake"]
    # no --store: DATA_DIR/rlgate.sqlite
    app = build_app(p.parse_args(base + ["--data-dir", str(tmp_path / "d")]), "k" * 40)
    store = app.state.gateway.store
    assert isinstance(store, SQLiteStore) and store.path == tmp_path / "d" / "rlgate.sqlite"
    # a second gateway on the same file refuses to start, with the reason
    with pytest.raises(SystemExit, match="in use by another rlgate process"):
        build_app(p.parse_args(base + ["--store", str(store.path)]), "k" * 40)
    store.close()
    app = build_app(p.parse_args(base + ["--store", str(tmp_path / "x.sqlite"), "--store-sync", "normal"]), "k" * 40)
    assert app.state.gateway.store.synchronous == "normal"
    app.state.gateway.store.close()
    assert isinstance(build_app(p.parse_args(base + ["--store", ":memory:"]), "k" * 40).state.gateway.store,
                      MemoryStore)
    monkeypatch.setenv("RLGATE_STORE", ":memory:")
    p2 = argparse.ArgumentParser()
    add_serve_args(p2)  # the default comes from the environment
    assert p2.parse_args(base).store == ":memory:"


# the event of each surface's stream that reports the end of the generation
FINAL_MARKERS = (b'"finish_reason":"', b"event: message_delta", b"event: response.completed",
                 b"event: response.incomplete")


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_no_response_reports_a_change_before_it_is_durable(make_app, asgi_client, tokenizer, tmp_path, sync):
    """The guarantee, checked from outside at the moment each response (or a stream's final
    event) is sent: a second connection must already see the change in the file."""
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path, synchronous=sync)
    app = make_app(FakeEngine(tokenizer, token_delay=0.001), store=store)
    checks: list[tuple[str, bool]] = []
    generated = 0

    def completed_in_file() -> int:
        db = sqlite3.connect(path)
        try:
            return db.execute("SELECT count(*) FROM interactions WHERE status = 'completed'").fetchone()[0]
        finally:
            db.close()

    def durable() -> bool:
        return sync == "normal" or store.synced  # fsynced, not only written

    class Probe:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            path_ = scope["path"]

            async def probe_send(message):
                if scope["type"] == "http":
                    generation = path_ in ("/v1/chat/completions", "/v1/messages", "/v1/responses")
                    if message["type"] == "http.response.start" and generation:
                        headers = dict(message.get("headers", []))
                        streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
                        scope["probe_streaming"] = streaming
                        if not streaming:
                            checks.append((path_, completed_in_file() == generated and durable()))
                    body = message.get("body", b"")
                    if (message["type"] == "http.response.body" and generation and scope.get("probe_streaming")
                            and any(m in body for m in FINAL_MARKERS)):
                        checks.append((path_ + " stream", completed_in_file() == generated and durable()))
                    if message["type"] == "http.response.start" and path_ == "/rl/set_reward":
                        db = sqlite3.connect(path)
                        n = db.execute("SELECT count(*) FROM interactions WHERE reward = 0.5").fetchone()[0]
                        db.close()
                        checks.append((path_, n == 1 and durable()))
                    if message["type"] == "http.response.start" and path_ == "/rl/end_session":
                        db = sqlite3.connect(path)
                        n = db.execute("SELECT count(*) FROM sessions WHERE status = 'ended'").fetchone()[0]
                        db.close()
                        checks.append((path_, n == 1 and durable()))
                await send(message)

            await self.inner(scope, receive, probe_send)

    async with asgi_client(Probe(app)) as c:
        sid, key = await start_session(c)
        h = key_headers(key)
        user = [{"role": "user", "content": "hi"}]
        for stream in (False, True):
            for p, body in (("/v1/chat/completions", {"messages": user, "max_tokens": 5}),
                            ("/v1/messages", {"messages": user, "max_tokens": 5}),
                            ("/v1/responses", {"input": "hi", "max_output_tokens": 5})):
                generated += 1
                r = await c.post(p, json={**body, "stream": stream}, headers=h)
                assert r.status_code == 200, r.text
        assert (await c.post("/rl/set_reward", json={"reward": 0.5}, headers=h)).status_code == 200
        assert (await c.post("/rl/end_session", headers=h)).status_code == 200
    assert len(checks) == 8 and all(ok for _, ok in checks), checks
    store.close()


async def test_client_store_flag_survives_a_restart(make_app, asgi_client, tokenizer, tmp_path):
    """store=false responses are recorded; after a restart they are still not referenceable."""
    path = tmp_path / "gw.sqlite"
    store = SQLiteStore(path)
    async with asgi_client(make_app(FakeEngine(tokenizer), store=store)) as c:
        _, key = await start_session(c)
        ids = []
        for flag in (True, False):
            r = await c.post("/v1/responses", json={"input": "hi", "store": flag}, headers=key_headers(key))
            assert r.status_code == 200
            ids.append(r.json()["id"])
    store.close()
    store2 = SQLiteStore(path)
    session = next(iter(make_app(FakeEngine(tokenizer), store=store2).state.gateway.sessions.sessions.values()))
    assert [session.interactions[i].client_store for i in ids] == [True, False]
    store2.close()
