"""The router as hardened as one gateway, and routed rather than random (issue 23).

Each test here failed on the router before: it read unauthenticated bodies (and said
``100 Continue``), had no body timeout or memory cap, showed replica internals on an anonymous
``/health``, sent ``/ui``, ``/metrics`` and ``/rl/collect`` to one random replica, and ended a
broken Responses stream with ``sequence_number`` 0 and no ``response.failed``.
Three ordinary gateways behind a router on 127.0.0.1, as in test_cluster_router.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from helpers import ADMIN_KEY, admin_headers, key_headers
from rlgate.cluster.directory import ReplicaTable, StaticDirectory
from rlgate.cluster.keys import derive_routing_secret, session_id_replica
from rlgate.cluster.router import Router
from rlgate.config import GatewayConfig
from rlgate.server.runner import ServerThread
from test_cluster_router import Deployment

SECRET = derive_routing_secret(ADMIN_KEY)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def cluster(tokenizer, stop_ids):
    d = Deployment(tokenizer, stop_ids, ui=True, body_timeout=1.0, max_body_bytes=64 * 1024 * 1024,
                   max_buffered_body_bytes=8 * 1024 * 1024)
    try:
        yield d
    finally:
        d.stop()


def _raw(url: str, head: bytes, body: bytes = b"", *, timeout: float = 30.0) -> bytes:
    """Send ``head`` (+ ``body``) on a new connection; what comes back until the server closes it
    or ``timeout`` passes."""
    host, port = url.removeprefix("http://").split(":")
    data = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head + body)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and b"connection: close" in data.lower():
                head_end = data.index(b"\r\n\r\n") + 4
                length = next((int(line.split(b":")[1]) for line in data[:head_end].split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if len(data) >= head_end + length:
                    break
    return data


def _post_head(path: str, length: int, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n").encode() + extra + b"\r\n"


# --------------------------------------------------------------------------- keys before bodies


def test_no_key_is_refused_before_the_body_is_read(cluster):
    """A 30 MB body announced without a key: 401 at once, with nothing of the body sent (the
    router used to buffer it: 20 of them took it from 172 MiB to 1,880 MiB)."""
    data = _raw(cluster.url, _post_head("/v1/chat/completions", 30 * 1024 * 1024))
    assert data.startswith(b"HTTP/1.1 401"), data[:300]
    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "missing_api_key"
    # Anthropic's shape on its route; Expect: 100-continue gets the refusal, not "100 Continue"
    data = _raw(cluster.url, _post_head("/v1/messages", 30 * 1024 * 1024, b"Expect: 100-continue\r\n"))
    assert data.startswith(b"HTTP/1.1 401") and b"100 Continue" not in data, data[:300]
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["type"] == "error"
    assert sum(len(e.requests) for e in cluster.engines) == 0


def test_unknown_and_forged_keys_are_refused_before_the_body(cluster):
    for key in ("a-key-nobody-ever-handed-out-0123456789abcdef", "rk1.1.AAAA.BBBB"):
        data = _raw(cluster.url, _post_head("/v1/chat/completions", 30 * 1024 * 1024,
                                            f"Authorization: Bearer {key}\r\n".encode() +
                                            b"Expect: 100-continue\r\n"))
        assert data.startswith(b"HTTP/1.1 401") and b"100 Continue" not in data, (key, data[:300])
    # a session key on an admin route: 403, body unread
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        key = c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers()).json()["api_key"]
    data = _raw(cluster.url, _post_head("/rl/update_weights", 30 * 1024 * 1024,
                                        f"Authorization: Bearer {key}\r\n".encode()))
    assert data.startswith(b"HTTP/1.1 403"), data[:300]


async def test_a_client_chosen_key_is_confirmed_once_with_its_replica(cluster):
    chosen = "my-own-session-key-0123456789abcdefghij"
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
        r = await c.post("/rl/start_session", json={"task_id": "t", "api_key": chosen}, headers=admin_headers())
        assert r.status_code == 200, r.text
        async with AsyncOpenAI(base_url=cluster.url + "/v1", api_key=chosen, max_retries=0) as oai:
            for _ in range(3):
                assert (await oai.chat.completions.create(**CHAT)).choices[0].finish_reason
        assert (await c.post("/rl/end_session", headers=key_headers(chosen))).status_code == 200
        r = await c.post("/export_trajectories", json={"session_id": r.json()["session_id"]}, headers=admin_headers())
        assert r.status_code == 200 and len(r.json()["interactions"]) == 3
        # exported: the key is retired; the router may still remember it, the replica answers 401
        r = await c.post("/v1/chat/completions", json=CHAT, headers=key_headers(chosen))
        assert r.status_code == 401, r.text


# --------------------------------------------------------------------------- body timeout and memory


def test_trickled_bodies_time_out_and_legitimate_requests_are_served(cluster):
    """Connections that send 10 of 1,000 body bytes are cut after body_timeout (408) whether or not
    they have a key, and requests from others are answered meanwhile (the router used to hold
    such connections until --max-connections was full: every legitimate request then got 503)."""
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        key = c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers()).json()["api_key"]
    host, port = cluster.url.removeprefix("http://").split(":")
    socks = []
    try:
        for i in range(40):
            s = socket.create_connection((host, int(port)), timeout=30)
            auth = f"Authorization: Bearer {key}\r\n".encode() if i % 2 else b""
            s.sendall(_post_head("/v1/chat/completions", 1000, auth) + b"{" * 10)
            socks.append(s)
        with httpx.Client(base_url=cluster.url, timeout=30) as c:
            for _ in range(5):
                r = c.post("/v1/chat/completions", json=CHAT, headers=key_headers(key))
                assert r.status_code == 200, r.text
        answers = []
        for s in socks:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            answers.append(data[:12])
        assert answers.count(b"HTTP/1.1 401") == 20, answers  # no key: refused at once
        assert answers.count(b"HTTP/1.1 408") == 20, answers  # a key, a body that never came: cut
    finally:
        for s in socks:
            s.close()


async def test_bodies_held_together_are_capped(cluster):
    """max_buffered_body_bytes (8 MiB here) bounds what the router holds at once: a body that would
    pass it gets 503 server_busy; the router's memory does not grow with concurrent uploads."""
    host, port = cluster.url.removeprefix("http://").split(":")
    blocker = socket.create_connection((host, int(port)), timeout=30)
    try:  # an admin upload of 7 MiB of 20 announced, held open
        blocker.sendall(_post_head("/rl/set_reward", 20 * 1024 * 1024, f"Authorization: Bearer {ADMIN_KEY}\r\n"
                                   .encode()) + b" " * (7 * 1024 * 1024))

        async def busy() -> bool:
            async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
                r = await c.post("/rl/set_reward", content=b" " * (2 * 1024 * 1024), headers=admin_headers())
                return r.status_code == 503 and r.json()["error"]["code"] == "server_busy"

        deadline = time.monotonic() + 60
        while not await busy():  # until the router has taken in the blocker's 7 MiB
            assert time.monotonic() < deadline, "the router never reported being busy"
    finally:
        blocker.close()


# --------------------------------------------------------------------------- what anyone may see


async def test_health_without_the_admin_key_says_only_the_status(cluster):
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
        anon = (await c.get("/health")).json()
        assert anon == {"status": "ok"}
        full = (await c.get("/health", headers=admin_headers())).json()
        assert [r["index"] for r in full["replicas"]] == [0, 1, 2] and all("pid" in r for r in full["replicas"])
        r = await c.get("/health", headers=key_headers("not-the-admin-key-0123456789abcdefgh"))
        assert r.json() == {"status": "ok"}


# --------------------------------------------------------------------------- routed, not random


async def _sessions_everywhere(c: httpx.AsyncClient, n: int = 9) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        r = await c.post("/rl/start_session", json={"task_id": f"g{i % 3}", "metadata": {"group": f"g{i % 3}"}},
                         headers=admin_headers())
        sid, key = r.json()["session_id"], r.json()["api_key"]
        async with AsyncOpenAI(base_url=str(c.base_url).rstrip("/") + "/v1", api_key=key, max_retries=0) as oai:
            await oai.chat.completions.create(**CHAT)
        assert (await c.post("/rl/set_reward", json={"reward": float(i)}, headers=key_headers(key))).status_code == 200
        out.append((sid, key))
    assert len({session_id_replica(sid) for sid, _ in out}) == 3, out
    return out


async def test_viewer_through_the_router_shows_the_whole_cluster(cluster):
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
        sessions = await _sessions_everywhere(c)
        # log in through the router with Origin but no Sec-Fetch-Site (the router rewrote Host: 403)
        r = await c.post("/ui/login", data={"key": ADMIN_KEY}, headers={"Origin": cluster.url})
        assert r.status_code == 303, r.text
        assert "rlgate_ui" in r.cookies
        for _ in range(4):  # every load the same: all 9 sessions, from all three replicas
            page = (await c.get("/ui")).text
            assert "9 sessions on 3 replicas" in page
            assert all(sid in page for sid, _ in sessions)
        for sid, _ in sessions:  # each session's page, whichever replica holds it
            r = await c.get("/ui/session", params={"id": sid})
            assert r.status_code == 200 and sid in r.text, (sid, r.status_code)
            assert r.headers["content-security-policy"].startswith("default-src 'none'")
        r = await c.get("/ui/group", params={"id": "g0"})
        assert r.status_code == 200
        assert all(sid in r.text for sid, _ in sessions[0::3])  # the group spans replicas
        r = await c.post("/ui/logout", headers={"Origin": cluster.url})
        assert r.status_code == 303
        c.cookies.clear()
        r = await c.get("/ui")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        r = await c.post("/ui/login", data={"key": ADMIN_KEY}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403


async def test_metrics_count_every_replica_with_a_replica_label(cluster):
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
        await _sessions_everywhere(c, 6)
        assert (await c.get("/metrics")).status_code == 401
        r = await c.get("/metrics", headers=admin_headers())
        assert r.status_code == 200
    samples = [s for fam in text_string_to_metric_families(r.text) for s in fam.samples]
    started = [s for s in samples if s.name == "rlgate_sessions_started_total"]
    assert sum(s.value for s in started) == 6 and {s.labels["replica"] for s in started} == {"0", "1", "2"}
    assert all("replica" in s.labels for s in samples
               if s.name.startswith("rlgate_") and s.name != "rlgate_router_forwarded_total")
    up = [s for s in samples if s.name == "rlgate_router_replica_up"]
    assert [s.value for s in up] == [1.0, 1.0, 1.0]


async def test_collect_gathers_finished_sessions_from_every_replica(cluster):
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
        sessions = await _sessions_everywhere(c)
        for _, key in sessions:
            assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
        got: list[str] = []
        first = await c.post("/rl/collect", json={"max_sessions": 4}, headers=admin_headers())
        assert first.status_code == 200 and len(first.json()["sessions"]) == 4
        got += [s["session_id"] for s in first.json()["sessions"]]
        while len(got) < 9:
            r = await c.post("/rl/collect", json={"max_sessions": 100, "wait_timeout": 1}, headers=admin_headers())
            assert r.status_code == 200
            got += [s["session_id"] for s in r.json()["sessions"]]
        assert sorted(got) == sorted(sid for sid, _ in sessions)  # each once, none lost
        r = await c.post("/rl/collect", json={"max_sessions": 0}, headers=admin_headers())
        assert r.status_code == 422


# --------------------------------------------------------------------------- a replica dies mid-stream


async def test_a_broken_responses_stream_ends_as_the_gateway_would_end_it(cluster):
    """The replica goes away after three events: the router's error frames carry on the
    stream's sequence numbers and end with response.failed for the same response."""
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as c:
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
        key = r.json()["api_key"]
        replica = session_id_replica(r.json()["session_id"])
        async with c.stream("POST", "/v1/responses", json={"model": "m", "input": "hi", "stream": True},
                            headers=key_headers(key)) as s:
            real = b"".join([chunk async for chunk in s.aiter_bytes()])
    frames = [f for f in real.split(b"\n\n") if f.strip()]
    assert len(frames) > 4

    async def dying(request):  # the first three events of a real stream, then the connection drops
        async def gen():
            for f in frames[:3]:
                yield f + b"\n\n"
            await asyncio.sleep(0)
            raise RuntimeError("replica died")
        return StreamingResponse(gen(), media_type="text/event-stream")

    async def health(request):
        return JSONResponse({"status": "ok", "version": 0})

    async def metrics(request):
        return JSONResponse({"open_sessions": 0})

    fake = ServerThread(Starlette(routes=[Route("/v1/responses", dying, methods=["POST"]),
                                          Route("/health", health), Route("/rl/metrics", metrics)]))
    urls = list(cluster.urls)
    urls[replica] = fake.start()
    table = ReplicaTable(StaticDirectory(urls, ADMIN_KEY), interval=0.1, timeout=2.0)
    router = ServerThread(Router(table, admin_key=ADMIN_KEY, config=GatewayConfig(admin_key=ADMIN_KEY)))
    try:
        url = router.start()
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            async with c.stream("POST", "/v1/responses", json={"model": "m", "input": "hi", "stream": True},
                                headers=key_headers(key)) as s:
                got = b"".join([chunk async for chunk in s.aiter_bytes()])
    finally:
        router.stop()
        fake.stop()
    events = [json.loads(line[6:]) for f in got.split(b"\n\n") for line in f.split(b"\n") if line.startswith(b"data: ")]
    assert [e["type"] for e in events[:3]] == [json.loads(f.split(b"data: ", 1)[1])["type"] for f in frames[:3]]
    assert [e["type"] for e in events[3:]] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in events] == list(range(5))
    failed = events[-1]["response"]
    assert failed["id"] == events[0]["response"]["id"] and failed["status"] == "failed"
    assert failed["error"]["code"] == "server_error" and events[3]["code"] == "replica_unavailable"
