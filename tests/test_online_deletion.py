"""Deletion that leaves nothing, at any moment (issue 36, failures 3, 4 and 5): a conversation deleted while a
training step holds its samples is never trained on again; the SQLite WAL forgets deleted text before the
200 (searched while the gateway runs, after a SIGKILL and after a restart); a preference across two
conversations is stored under each reply's own conversation; a header-less conversation named by a later
turn's id is deleted whole."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, admin_headers, eventually, free_port, wait_healthy
from online_helpers import chat, new_tenant, online_app, reply_of, wired
from rlgate.store.sqlite import SQLiteStore

SECRET = "my passport number is X1234-ZZ-9876"


def store_files(path: Path) -> dict[str, bytes]:
    """Every file of the store (database, WAL, shared memory), read through the file system."""
    return {p.name: p.read_bytes() for p in path.parent.iterdir() if p.name.startswith(path.name)}


def holding(path: Path, *needles: str) -> dict[str, list[str]]:
    """Which of ``needles`` each store file holds (only files holding one are listed)."""
    out = {name: [n for n in needles if n.encode() in data] for name, data in store_files(path).items()}
    return {k: v for k, v in out.items() if v}


class HeldStep:
    """A stepper that holds each step until released (a step in flight while a deletion comes)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[list[str]] = []

    def step(self, samples, group_ids, current_version):
        self.calls.append([s.id for s in samples])
        self.entered.set()
        assert self.release.wait(120)
        return {"loss": 0.0}


async def test_a_conversation_deleted_during_a_training_step_is_not_trained_on_again(
        tokenizer, stop_ids, asgi_client):
    held = HeldStep()
    app, training, _ = wired(tokenizer, stop_ids, stepper=held, train_batch=2, replay_fraction=1.0)
    trainer = training.trainer
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        gone = await chat(c, tenant, [{"role": "user", "content": "forget me"}], conversation="gone")
        keep = await chat(c, tenant, [{"role": "user", "content": "keep me"}], conversation="keep")
        for turn, up in ((gone, True), (keep, False)):
            r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": up, "interaction_id": turn},
                             headers=tenant)
            assert r.status_code == 200
        await eventually(held.entered.is_set, what="the step to start")
        assert held.calls == [[gone, keep]] and trainer.pending_samples == 0 and not trainer.replay
        r = await c.post("/v1/data/delete", json={"conversation_id": "gone"}, headers=tenant)
        assert r.status_code == 200
        held.release.set()
        await eventually(lambda: trainer.counts["steps"] == 1, what="the step to end")
        # the deleted turn left with the step: only the kept one may be replayed
        assert [s.id for u in trainer.replay for s in u.samples] == [keep]
        assert trainer.counts["dropped_deleted"] == 1
        k2 = await chat(c, tenant, [{"role": "user", "content": "more"}], conversation="keep2")
        k3 = await chat(c, tenant, [{"role": "user", "content": "again"}], conversation="keep3")
        for turn in (k2, k3):
            await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turn},
                         headers=tenant)
        await eventually(lambda: trainer.counts["steps"] == 2, what="the next step")
        assert gone not in held.calls[1] and keep in held.calls[1]  # replayed: the kept turn only


async def test_deleted_text_is_gone_from_every_store_file_before_the_200(tokenizer, stop_ids, asgi_client, tmp_path):
    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        secret = await chat(c, tenant, [{"role": "user", "content": SECRET}], conversation="private-7431")
        kept = await chat(c, tenant, [{"role": "user", "content": "the weather today"}], conversation="public")
        r = await c.post("/v1/feedback", json={"kind": "comment", "value": "about " + SECRET,
                                               "interaction_id": secret}, headers=tenant)
        assert r.status_code == 200
        app.state.gateway.store.flush()
        for _ in range(600):  # until the sync thread has written it: the text is then in the store's files
            if holding(path, SECRET, "private-7431", secret):
                break
            await asyncio.sleep(0.05)
        assert holding(path, SECRET, "private-7431", secret)
        r = await c.post("/v1/data/delete", json={"conversation_id": "private-7431"}, headers=tenant)
        assert r.status_code == 200
        # the gateway still runs: no file of the store holds the text, the conversation id or the turn id
        assert holding(path, SECRET, "private-7431", secret) == {}
        assert (tmp_path / "s.sqlite-wal").stat().st_size == 0
        assert "the weather today" in str(holding(path, "the weather today"))
        assert kept


async def test_a_preference_across_conversations_is_deleted_with_either(tokenizer, stop_ids, asgi_client, tmp_path):
    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        a = await chat(c, tenant, [{"role": "user", "content": "first"}], conversation="conv-a")
        b = await chat(c, tenant, [{"role": "user", "content": "second"}], conversation="conv-b")
        r = await c.post("/v1/feedback", json={"kind": "preference", "value": 1, "interaction_id": a,
                                               "other_interaction_id": b}, headers=tenant)
        assert r.status_code == 200, r.text
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT interaction_id, conversation_id FROM feedback ORDER BY seq").fetchall()
        assert sorted(rows) == sorted([(a, "conv-a"), (b, "conv-b")])  # each under its own conversation
        r = await c.post("/v1/data/delete", json={"conversation_id": "conv-b"}, headers=tenant)
        assert r.status_code == 200
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT COUNT(*) FROM feedback").fetchone() == (0,)  # the pair went whole
        assert holding(path, b) == {}
        # a reply cannot be preferred over itself
        r = await c.post("/v1/feedback", json={"kind": "preference", "value": 1, "interaction_id": a,
                                               "other_interaction_id": a}, headers=tenant)
        assert r.status_code == 400 and r.json()["error"]["param"] == "other_interaction_id"


async def test_a_header_less_conversation_named_by_a_later_turn_is_deleted_whole(
        tokenizer, stop_ids, asgi_client, tmp_path):
    path = tmp_path / "s.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        a1 = await chat(c, tenant, [{"role": "user", "content": SECRET}])
        a2 = await chat(c, tenant, [{"role": "user", "content": SECRET}, reply_of(app, a1),
                                    {"role": "user", "content": "and then?"}])
        b1 = await chat(c, tenant, [{"role": "user", "content": "unrelated"}])
        # conversation-level feedback named by the later turn lands on the conversation (its first turn's id)
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "conversation_id": a2},
                         headers=tenant)
        assert r.status_code == 200 and r.json()["conversation_id"] == a1
        r = await c.post("/v1/data/delete", json={"conversation_id": a2}, headers=tenant)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["interaction_ids"]) == sorted([a1, a2]) and r.json()["conversation_ids"] == [a1]
        with sqlite3.connect(path) as db:
            assert {row[0] for row in db.execute("SELECT id FROM interactions")} == {b1}
            assert db.execute("SELECT COUNT(*) FROM feedback").fetchone() == (0,)
        assert holding(path, SECRET) == {}


@pytest.mark.slow
async def test_deleted_text_stays_gone_after_a_sigkill_and_a_restart(tiny_tokenizer_dir, tmp_path):
    store = tmp_path / "online.sqlite"

    def serve(port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--store", str(store),
             "--online"], env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)

    port = free_port()
    proc = serve(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            r = await http.post("/v1/tenants", json={"name": "shop"}, headers=admin_headers())
            key = r.json()["api_key"]
            oai = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            turns = []
            for k in range(3):
                reply = await oai.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"{SECRET} ({k})"}], max_tokens=4,
                    extra_headers={"X-Conversation-Id": "private-7431"})
                turns.append(reply.id)
            kept = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "weather"}],
                                                     max_tokens=4, extra_headers={"X-Conversation-Id": "public"})
            await oai.close()
            tenant = {"Authorization": f"Bearer {key}"}
            r = await http.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": turns[0],
                                                      "metadata": {"note": SECRET}}, headers=tenant)
            assert r.status_code == 200
            deadline = time.monotonic() + 60
            while not holding(store, SECRET).get(store.name):  # checkpointed into the database file as well
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            r = await http.post("/v1/data/delete", json={"conversation_id": "private-7431"}, headers=tenant)
            assert r.status_code == 200
            assert holding(store, SECRET, "private-7431", *turns) == {}  # running
            r = await http.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": kept.id},
                                headers=tenant)  # more writes after the deletion
            assert r.status_code == 200
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        assert holding(store, SECRET, "private-7431", *turns) == {}  # killed
        proc = serve(port)
        wait_healthy(url, proc)
        assert holding(store, SECRET, "private-7431", *turns) == {}  # restarted
        r = httpx.get(url + "/v1/feedback", headers=admin_headers(), timeout=60)
        assert [e["interaction_id"] for e in r.json()["data"]] == [kept.id]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
