"""Durability by construction: every write the session manager makes during a request is waited for
before that request's answer, without a call to remember beside each save (core/request_scope.py:
ScopedStore); a failed write is refused the same way wherever it is seen (store_refusal)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse

from helpers import admin_headers, eventually, key_headers, start_session
from rlgate.core.request_scope import ScopedStore
from rlgate.store.base import MemoryStore, StoreError


class GatedStore(MemoryStore):
    """Writes get sequence numbers; they become durable only when the test opens the gate (or fail)."""

    def __init__(self) -> None:
        self.seq = 0
        self.saved: dict[int, str] = {}  # seq -> what was written
        self.waiting: list[int] = []  # seqs a request is waiting for right now
        self.gate = asyncio.Event()
        self.fail = False

    def _write(self, what: str) -> int:
        self.seq += 1
        self.saved[self.seq] = what
        return self.seq

    def save_session(self, session) -> int:
        return self._write(f"session {session.id}")

    def save_interaction(self, interaction) -> int:
        return self._write(f"interaction {interaction.id}")

    def save_meta(self, key, value) -> int:
        return self._write(f"meta {key}")

    def delete_session(self, session_id) -> int:
        return self._write(f"delete {session_id}")

    async def wait_durable(self, seqs: Sequence[int]) -> None:
        self.waiting = list(seqs)
        try:
            await self.gate.wait()
        finally:
            self.waiting = []
        if self.fail:
            raise StoreError("disk full (test)")


async def test_a_save_without_any_note_is_still_awaited_before_the_2xx(make_app, asgi_client):
    """A new route that writes through the session manager's store, as a future change might: nothing
    but the write itself; the answer still waits until the write is durable."""
    store = GatedStore()
    app = make_app(store=store)
    sessions = app.state.gateway.sessions
    assert isinstance(sessions.store, ScopedStore) and sessions.store.inner is store
    assert store not in vars(sessions).values()  # the manager holds no way around the barrier

    async def new_feature(request: Request) -> JSONResponse:
        sessions.store.save_meta("new_feature", 1)  # no note_write, no scope, nothing else
        return JSONResponse({"ok": True})

    app.add_route("/rl/new_feature", new_feature, methods=["POST"])
    async with asgi_client(app) as c:
        answer = asyncio.ensure_future(c.post("/rl/new_feature", headers=admin_headers()))
        await eventually(lambda: store.waiting or answer.done(), timeout=60)
        assert [store.saved[s] for s in store.waiting] == ["meta new_feature"]
        assert not answer.done()  # held until the write is durable
        store.gate.set()
        r = await asyncio.wait_for(answer, 30)
    assert r.status_code == 200 and r.json() == {"ok": True}


async def test_every_session_manager_write_of_a_turn_is_awaited(make_app, asgi_client):
    store = GatedStore()
    store.gate.set()
    app = make_app(store=store)
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        store.gate.clear()
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = asyncio.ensure_future(c.post("/v1/chat/completions", json=body, headers=key_headers(key)))
        await eventually(lambda: store.waiting or answer.done(), timeout=60)
        turn = [store.saved[s] for s in store.waiting]  # the pending turn and its completion
        assert len(turn) == 2 and len(set(turn)) == 1 and turn[0].startswith("interaction ")
        assert not answer.done()
        store.gate.set()
        assert (await asyncio.wait_for(answer, 30)).status_code == 200


async def test_a_failed_write_is_refused_with_one_answer_on_every_path(make_app, asgi_client):
    """The same 503 (store_unavailable) and the same undo from the durability middleware (a plain
    answer) and from a stream's final event (GenerationService.run)."""
    store = GatedStore()
    store.gate.set()
    app = make_app(store=store)
    sessions = app.state.gateway.sessions
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        store.fail = True
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        plain = await c.post("/v1/chat/completions", json=body, headers=key_headers(key))
        assert plain.status_code == 503
        assert plain.json()["error"]["code"] == "store_unavailable"
        assert plain.json()["error"]["message"] == "disk full (test)"
        assert not sessions.sessions[sid].interactions  # undone: nothing to land a reward on
        async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                            headers=key_headers(key)) as s:
            text = (await s.aread()).decode()
        assert '"code":"store_unavailable"' in text.replace(" ", "") and "disk full (test)" in text
        assert not sessions.sessions[sid].interactions
        anthropic = await c.post("/v1/messages", json={**body, "max_tokens": 4}, headers=key_headers(key))
        assert anthropic.status_code == 503
        assert anthropic.json()["error"]["type"] == "overloaded_error"
