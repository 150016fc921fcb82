"""Issue 15, defects 3 and 9: the durability rule when the disk fills up.

"Disk full" is real here: ``rlgate serve --store X.sqlite`` runs as a subprocess and the test
lowers its ``RLIMIT_FSIZE`` (``prlimit``) to one byte, so every write SQLite makes to its files
fails with EFBIG (Python ignores SIGXFSZ), then raises it again ("space freed").

* a turn refused with 503 leaves no interaction in memory for ``set_reward`` to land on: the
  reward goes to the last *durable* interaction and survives a restart;
* a refused ``start_session`` leaves no orphan session holding a slot or granted capacity.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from helpers import ADMIN_KEY, free_port, wait_healthy
from wire import chat_call

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@contextmanager
def gateway(model: Path, store: Path, *extra: str):
    port = free_port()
    log = open(store.with_suffix(".log"), "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model), "--engine", "fake", "--port", str(port),
         "--store", str(store), *extra],
        env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        with httpx.Client(base_url=url, timeout=60) as c:
            yield proc, c
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()


@contextmanager
def disk_full(proc: subprocess.Popen):
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
    try:
        yield
    finally:
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.mark.slow
def test_a_refused_turn_leaves_nothing_a_reward_can_land_on(tiny_tokenizer_dir, tmp_path):
    store = tmp_path / "gw.sqlite"
    with gateway(tiny_tokenizer_dir, store) as (proc, c):
        r = c.post("/rl/start_session", json={"task_id": "t"}, headers=ADMIN)
        sid, key = r.json()["session_id"], r.json()["api_key"]
        messages = [{"role": "user", "content": "hello"}]
        r = c.post(**chat_call(key, messages, max_tokens=8))
        assert r.status_code == 200
        durable_id = r.json()["id"]
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        with disk_full(proc):
            r = c.post(**chat_call(key, messages, max_tokens=8))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "store_unavailable"
            r = c.post(**chat_call(key, messages, max_tokens=8, stream=True))  # streamed: the in-band error event
            assert r.status_code == 200 and '"code":"store_unavailable"' in r.text
        # space is back: the reward goes to the last interaction that is in the store
        r = c.post("/rl/set_reward", json={"reward": 7.0}, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        assert r.json()["interaction_id"] == durable_id
        assert c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    with gateway(tiny_tokenizer_dir, store) as (proc, c):  # what a 200 said is in the store
        exp = c.post("/export_trajectories", json={"session_id": sid}, headers=ADMIN).json()
        assert [(i["id"], i["reward"]) for i in exp["interactions"]] == [(durable_id, 7.0)]


@pytest.mark.slow
def test_a_refused_start_session_leaves_no_orphan(tiny_tokenizer_dir, tmp_path):
    store = tmp_path / "gw.sqlite"
    with gateway(tiny_tokenizer_dir, store, "--capacity-mode", "granted", "--max-sessions", "2") as (proc, c):
        assert c.post("/grant_capacity", json={"count": 2}, headers=ADMIN).status_code == 200
        assert c.post("/rl/start_session", json={"task_id": "a"}, headers=ADMIN).status_code == 200
        with disk_full(proc):
            for _ in range(3):
                r = c.post("/rl/start_session", json={"task_id": "b"}, headers=ADMIN)
                assert r.status_code == 503, r.text
        metrics = c.get("/rl/metrics", headers=ADMIN).json()
        assert metrics["open_sessions"] == 1 and metrics["sessions"] == 1 and metrics["capacity"] == 1
        r = c.post("/rl/start_session", json={"task_id": "b"}, headers=ADMIN)  # the slot and the grant are free
        assert r.status_code == 200, r.text
        assert r.json()["session_id"] == "b-0"


async def test_a_start_session_the_store_refuses_leaves_no_orphan(make_app, asgi_client, tmp_path):
    """Identifiers the store cannot hold (unpaired surrogates) are refused before anything changes."""
    from rlgate.store import open_store

    store = open_store(tmp_path / "gw.sqlite")
    app = make_app(store=store, capacity_mode="granted")
    async with asgi_client(app) as c:
        assert (await c.post("/grant_capacity", headers=ADMIN)).status_code == 200
        for body in (rb'{"task_id": "bad\ud800"}', rb'{"task_id": "t", "metadata": {"k": "\udfff"}}'):
            r = await c.post("/rl/start_session", content=body, headers={**ADMIN, "content-type": "application/json"})
            assert r.status_code in (400, 422), r.text
        m = (await c.get("/rl/metrics", headers=ADMIN)).json()
        assert m["sessions"] == 0 and m["capacity"] == 1
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=ADMIN)
        assert r.status_code == 200
    store.close()


def _fill_up(store) -> int:
    """Make the SQLite file full (no new page may be allocated); return the old limit."""
    conn = store._commits.conn
    with store._commits.db_lock:
        old = conn.execute("PRAGMA max_page_count").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages}")
    return old


def _free_up(store, limit: int) -> None:
    with store._commits.db_lock:
        store._commits.conn.execute(f"PRAGMA max_page_count={limit}")


async def test_full_database_in_process(make_app, asgi_client, tmp_path):
    """The same rule with SQLite's own "database or disk is full" (PRAGMA max_page_count): a refused
    turn is forgotten, a reward lands on what is stored, an update never silently matches no row."""
    from rlgate.store import open_store
    from rlgate.store.sqlite import SQLiteStore

    path = tmp_path / "gw.sqlite"
    store = open_store(path)
    app = make_app(store=store)
    async with asgi_client(app) as c:
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=ADMIN)
        sid, key = r.json()["session_id"], r.json()["api_key"]
        h = {"Authorization": f"Bearer {key}"}
        msgs = [{"role": "user", "content": "hello"}]
        r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4}, headers=h)
        durable_id = r.json()["id"]
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "long " * 1000}]
        limit = _fill_up(store)
        r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4}, headers=h)
        assert r.status_code == 503, r.text
        assert len(app.state.gateway.sessions.sessions[sid].interactions) == 1
        _free_up(store, limit)
        r = await c.post("/rl/set_reward", json={"reward": 3.0}, headers=h)
        assert r.status_code == 200 and r.json()["interaction_id"] == durable_id
    store.close()
    reloaded = SQLiteStore(path)
    (session,) = reloaded.load()
    assert [(i.id, i.reward) for i in session.interactions.values()] == [(durable_id, 3.0)]
    reloaded.close()


async def test_an_update_of_a_row_never_written_fails(tmp_path):
    from rlgate.store.base import StoreError
    from rlgate.store.sqlite import SQLiteStore
    from rlgate.trajectory.interaction import Interaction, Session

    store = SQLiteStore(tmp_path / "s.sqlite")
    s = Session(id="t-0", task_id="t", key_hash="h")
    await store.wait_durable([store.save_session(s)])
    i = Interaction(id="i1", session_id="t-0", api="chat", messages=[], tools=[], prompt_ids=list(range(5000)))
    limit = _fill_up(store)
    seq = store.save_interaction(i)
    with pytest.raises(StoreError):
        await store.wait_durable([seq])
    _free_up(store, limit)
    i.reward = 1.0
    seq = store.save_interaction(i)  # inserted afresh, not an UPDATE of nothing
    await store.wait_durable([seq])
    store.close()
    reloaded = SQLiteStore(tmp_path / "s.sqlite")
    (session,) = reloaded.load()
    assert session.interactions["i1"].reward == 1.0 and session.interactions["i1"].prompt_ids == list(range(5000))
    reloaded.close()
