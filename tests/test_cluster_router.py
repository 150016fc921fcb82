"""The router in front of gateway replicas, without Ray: keys, routing, errors, SSE passthrough.

Three ordinary gateways (each with the replica naming of its index) are served on 127.0.0.1 and
a router polls them over HTTP (``StaticDirectory``). The Ray tests (test_cluster_ray.py) run the
same router in front of replica actors.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, admin_headers, eventually, key_headers
from rlgate.cluster.directory import ReplicaTable, StaticDirectory
from rlgate.cluster.keys import (
    ReplicaNaming,
    derive_routing_secret,
    hashed_replica,
    key_replica,
    mint_key,
    session_id_replica,
)
from rlgate.cluster.router import Router
from rlgate.config import GatewayConfig
from rlgate.engine.fake import FakeEngine
from rlgate.server.app import create_app
from rlgate.server.runner import ServerThread
from rlgate.store.base import MemoryStore

SECRET = derive_routing_secret(ADMIN_KEY)


# --------------------------------------------------------------------------- keys


def test_minted_keys_name_their_replica_and_cannot_be_forged():
    key = mint_key(SECRET, 2)
    assert key.startswith("rk1.2.") and len(key) >= 64
    assert key_replica(SECRET, key) == 2
    body, _, tag = key.rpartition(".")
    forged_replica = key.replace("rk1.2.", "rk1.0.", 1)  # same tag, other replica
    assert key_replica(SECRET, forged_replica) is None
    flipped = body + "." + ("A" if tag[0] != "A" else "B") + tag[1:]
    assert key_replica(SECRET, flipped) is None
    assert key_replica(derive_routing_secret("another-admin-key-0123456789abcdef"), key) is None
    for junk in ("rk1.", "rk1.x.y.z", "rk1.1.a.b.c", "rk1.1234567.a.b", "rk1.1.é.é", ""):
        assert key_replica(SECRET, junk) is None
    assert len({mint_key(SECRET, 0) for _ in range(100)}) == 100


def test_hashed_replicas_and_session_ids():
    keys = [f"client-chosen-key-{i:04d}-0123456789abcdef" for i in range(300)]
    spread = [hashed_replica(k, 3) for k in keys]
    assert spread == [hashed_replica(k, 3) for k in keys]  # the same on every router
    assert {spread.count(i) for i in range(3)} and min(spread.count(i) for i in range(3)) > 60
    naming = ReplicaNaming(7, SECRET)
    assert session_id_replica(naming.session_id("task-0")) == 7
    assert session_id_replica("task-0") is None
    assert key_replica(SECRET, naming.new_key()) == 7
    assert "secret" not in repr(naming).lower() and SECRET.hex() not in repr(naming)


# --------------------------------------------------------------------------- a router over 3 gateways


class Deployment:
    def __init__(self, tokenizer, stop_ids, n: int = 3, **config) -> None:
        self.engines = [FakeEngine(tokenizer, output_tokens=8) for _ in range(n)]
        self.servers = []
        for i, engine in enumerate(self.engines):
            app = create_app(GatewayConfig(admin_key=ADMIN_KEY, **config), engine, MemoryStore(), tokenizer,
                             stop_token_ids=stop_ids, naming=ReplicaNaming(i, SECRET))
            self.servers.append(ServerThread(app))
        self.urls = [s.start() for s in self.servers]
        self.directory = StaticDirectory(self.urls, ADMIN_KEY)
        self.table = ReplicaTable(self.directory, interval=0.1, timeout=2.0)
        self.config = GatewayConfig(admin_key=ADMIN_KEY, **config)  # the router applies the replicas' limits
        self.router = Router(self.table, admin_key=ADMIN_KEY, config=self.config)
        self.router_server = ServerThread(self.router)
        self.url = self.router_server.start()

    def stop(self) -> None:
        self.router_server.stop()
        for s in self.servers:
            s.stop()


@pytest.fixture
def deployment(tokenizer, stop_ids):
    d = Deployment(tokenizer, stop_ids)
    try:
        yield d
    finally:
        d.stop()


async def _start(c: httpx.AsyncClient, task: str = "t", **body) -> tuple[str, str]:
    r = await c.post("/rl/start_session", json={"task_id": task, **body}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


async def _until_state(c: httpx.AsyncClient, index: int, state: str) -> None:
    async def reached() -> bool:
        health = (await c.get("/health", headers=admin_headers())).json()
        return health["replicas"][index]["state"] == state

    await eventually(reached, interval=0.05, what=f"replica {index} {state}")


async def test_sessions_spread_and_stick_to_their_replica(deployment):
    async with httpx.AsyncClient(base_url=deployment.url, timeout=30) as c:
        sessions = [await _start(c, f"task{i}") for i in range(24)]
        replicas = [session_id_replica(sid) for sid, _ in sessions]
        assert len(set(replicas)) == 3  # power of two choices spreads them out
        for (_, key), replica in zip(sessions, replicas, strict=True):
            assert key_replica(SECRET, key) == replica
        # every request of a session lands on its replica: two turns, then export there
        sid, key = sessions[0]
        oai = AsyncOpenAI(base_url=deployment.url + "/v1", api_key=key, max_retries=0)
        first = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await oai.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "again"}])
        assert (await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))).status_code == 200
        assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
        r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        assert r.status_code == 200, r.text
        inters = r.json()["interactions"]
        assert len(inters) == 2 and inters[-1]["reward"] == 1.0
        assert sum(len(e.requests) for e in deployment.engines) == 2
        assert len(deployment.engines[replicas[0]].requests) == 2
        r = await c.get("/health", headers=admin_headers())
        body = r.json()
        assert body["status"] == "ok" and [x["index"] for x in body["replicas"]] == [0, 1, 2]
        assert all({"node", "pid", "state", "load"} <= set(x) for x in body["replicas"])


async def test_streams_pass_through_for_every_surface(deployment):
    async with httpx.AsyncClient(base_url=deployment.url, timeout=30) as c:
        _, key = await _start(c)
    oai = AsyncOpenAI(base_url=deployment.url + "/v1", api_key=key, max_retries=0)
    stream = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    assert text
    resp = await oai.responses.create(model="m", input="hello", stream=True)
    kinds = [ev.type async for ev in resp]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    ant = AsyncAnthropic(base_url=deployment.url, api_key=key, max_retries=0)
    async with ant.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
        final = await s.get_final_message()
    assert final.content[0].text


async def test_forged_keys_are_refused_in_each_api_shape(deployment):
    forged = mint_key(derive_routing_secret("not-the-admin-key-0123456789abcdef"), 1)
    async with httpx.AsyncClient(base_url=deployment.url, timeout=30) as c:
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                         headers=key_headers(forged))
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = await c.post("/v1/messages", json={"model": "m", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "x"}]},
                         headers={"x-api-key": forged})
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error"
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=key_headers(forged))
        assert r.status_code == 403  # a replica answers: not the admin key
        r = await c.post("/export_trajectories", json={"session_id": "no-replica-prefix"}, headers=admin_headers())
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert sum(len(e.requests) for e in deployment.engines) == 0


async def test_a_down_replica_fails_only_its_sessions(deployment):
    async with httpx.AsyncClient(base_url=deployment.url, timeout=30) as c:
        sessions = [await _start(c, f"t{i}") for i in range(12)]
        deployment.servers[1].stop()
        await _until_state(c, 1, "down")
        for sid, key in sessions:
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "x"}]}, headers=key_headers(key))
            if session_id_replica(sid) == 1:
                assert r.status_code == 503 and r.json()["error"]["code"] == "replica_unavailable"
                assert "replica 1" in r.json()["error"]["message"]
            else:
                assert r.status_code == 200, r.text
            r = await c.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x"}]}, headers={"x-api-key": key})
            if session_id_replica(sid) == 1:
                assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        new = [await _start(c, f"n{i}") for i in range(10)]
        assert 1 not in {session_id_replica(sid) for sid, _ in new}


async def test_client_chosen_keys_and_granted_capacity(tokenizer, stop_ids):
    d = Deployment(tokenizer, stop_ids, capacity_mode="granted")
    try:
        async with httpx.AsyncClient(base_url=d.url, timeout=30) as c:
            r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
            assert r.status_code == 429 and r.json()["error"]["code"] == "no_capacity"
            r = await c.post("/grant_capacity", json={"count": 4}, headers=admin_headers())
            assert r.status_code == 200 and r.json() == {"capacity": 4}
            started = [await _start(c, f"t{i}") for i in range(4)]  # wherever capacity is left
            assert len(started) == 4
            r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
            assert r.status_code == 429
            await c.post("/grant_capacity", json={"count": 3}, headers=admin_headers())
            chosen = "my-own-session-key-0123456789abcdefghij"
            sid, key = await _start(c, "mine", api_key=chosen)
            assert key == chosen and session_id_replica(sid) == hashed_replica(chosen, 3)
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "x"}]}, headers=key_headers(chosen))
            assert r.status_code == 200, r.text
            r = await c.post("/rl/start_session", json={"task_id": "t", "api_key": "rk1." + "a" * 40},
                             headers=admin_headers())
            assert r.status_code == 400 and r.json()["error"]["param"] == "api_key"
            m = (await c.get("/rl/metrics", headers=admin_headers())).json()
            assert m["sessions_started"] == 5 and len(m["replicas"]) == 3
            assert (await c.get("/rl/metrics", headers=key_headers(key))).status_code == 403
    finally:
        d.stop()


async def test_router_handles_many_concurrent_sessions(deployment):
    import httpx2  # what the OpenAI SDK is built on: one pool for every agent

    async with httpx.AsyncClient(base_url=deployment.url, timeout=120) as c, httpx2.AsyncClient(timeout=120) as pool:
        async def episode(i: int) -> str:
            _, key = await _start(c, f"e{i}")
            oai = AsyncOpenAI(base_url=deployment.url + "/v1", api_key=key, max_retries=0, http_client=pool)
            r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
            return r.choices[0].finish_reason

        done = await asyncio.gather(*(episode(i) for i in range(30)))
    assert done == ["stop"] * 30


def test_a_local_ray_cluster_has_room_for_its_replicas(monkeypatch):
    """Ray's CPUs are scheduling slots: three replicas of one CPU each on a 2-core machine waited
    for ever for the third (docs/scale-out.md's first example)."""
    import os

    from rlgate.cluster.launch import local_num_cpus
    from rlgate.config import ClusterConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert local_num_cpus(ClusterConfig(replicas=3)) == 3
    assert local_num_cpus(ClusterConfig(replicas=3, replica_num_cpus=1.5)) == 5
    assert local_num_cpus(ClusterConfig(replicas=2)) is None  # they fit: Ray counts the machine's
    assert local_num_cpus(ClusterConfig(replicas=0)) is None
    assert local_num_cpus(ClusterConfig(replicas=3, ray_num_cpus=1)) == 1  # said explicitly: as said
