"""Issue 15, defect 2: bodies are not read before auth; headers and bodies have read timeouts;
connections are capped with a clear 503; the log never floods (real sockets, real uvicorn)."""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from helpers import ADMIN_KEY, free_port, start_session, wait_healthy
from rlgate.server.runner import ServerThread


def raw_request(url: str, head: bytes, body: bytes = b"", wait: float = 10.0) -> tuple[int | None, bytes]:
    """Send ``head`` (+ ``body``) on a fresh socket; return (status, response bytes) or (None, b"")
    if the server neither answered nor closed within ``wait`` seconds."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(head + body)
        data = b""
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data and _complete(data):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    return int(data[9:12]), data


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def json_body(data: bytes) -> dict:
    return json.loads(data.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize(("path", "token", "status"), [
    ("/v1/chat/completions", None, 401),
    ("/v1/chat/completions", "not-a-key-" + "x" * 30, 401),
    ("/v1/messages", None, 401),
    ("/rl/start_session", "not-a-key-" + "x" * 30, 403),
])
def test_unauthenticated_bodies_are_refused_before_they_are_read(make_app, path, token, status):
    """The landed gateway buffered every body before looking at the key (100 unauthenticated
    30 MB uploads: 3.46 GB). The answer must come while the 30 MB body is still unsent."""
    app = make_app()
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {30 * 1024 * 1024}\r\n").encode() + auth + b"\r\n"
    with ServerThread(app) as url:
        got, data = raw_request(url, head, b'{"messages": [', wait=10)
        assert got == status, data[:300]
        err = json_body(data)
        assert (err["type"] == "error") if path.startswith("/v1/messages") else ("code" in err["error"])
        assert b"connection: close" in data.lower()
        assert httpx.get(url + "/health").status_code == 200


def test_slow_headers_are_cut(make_app):
    """The landed gateway kept 1000 slow-header connections open for more than 90 s."""
    app = make_app(header_timeout=0.5)
    with ServerThread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
            t0 = time.monotonic()
            try:
                closed = s.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed = False
            assert closed, "the server kept a slow-header connection open"
            assert time.monotonic() - t0 < 5
        # a kept-alive connection is not cut between requests (only once a next request starts)
        with httpx.Client(base_url=url) as c:
            assert c.get("/health").status_code == 200
            for _ in range(3):
                assert c.get("/health").status_code == 200


def test_slow_body_gets_408(make_app):
    app = make_app(body_timeout=0.5)
    with ServerThread(app) as url:
        _, key = httpx_start_session(url)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
        got, data = raw_request(url, head, b'{"messages": [', wait=10)
        assert got == 408, data[:300]
        assert json_body(data)["error"]["code"] == "request_timeout"


def httpx_start_session(url: str) -> tuple[str, str]:
    r = httpx.post(url + "/rl/start_session", json={"task_id": "t"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


def test_connection_cap_answers_503_in_the_api_shape(make_app):
    app = make_app(max_connections=3)
    with ServerThread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(3)]
        try:
            got, data = raw_request(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got == 503, data[:300]
            assert json_body(data)["error"]["code"] == "too_many_connections"
            assert b"retry-after: 1" in data.lower()
            got, data = raw_request(url, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert got == 503 and json_body(data)["type"] == "error"  # Anthropic routes: Anthropic's shape
        finally:
            for s in idle:
                s.close()
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").status_code != 200:  # the idle ones were closed: served again
            assert time.monotonic() < deadline


def test_repeated_log_messages_are_limited():
    from rlgate.server.logging_filters import RepeatFilter

    now = [0.0]
    f = RepeatFilter(burst=3, window=10.0, clock=lambda: now[0])

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    passed = [f.filter(rec("socket.accept() out of system resource")) for _ in range(100)]
    assert sum(passed) == 3
    assert f.filter(rec("another message"))  # other messages are not held back
    now[0] = 11.0
    r = rec("socket.accept() out of system resource")
    assert f.filter(r) and "97 more like this suppressed" in r.getMessage()


def test_access_log_and_info_lines_are_never_held_back():
    """One template, one line per request: the access log, "session %s started", debug traces."""
    from rlgate.server.logging_filters import RepeatFilter

    f = RepeatFilter(burst=3, window=60.0, clock=lambda: 0.0)
    access = [logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                ("127.0.0.1:5", "GET", f"/health?{k}", "1.1", 200), None) for k in range(50)]
    debug = [logging.LogRecord("rlgate.core", logging.DEBUG, __file__, 1, "turn %s", (k,), None) for k in range(50)]
    assert all(f.filter(r) for r in access + debug) and f.suppressed == 0
    warnings = [logging.LogRecord("rlgate.api", logging.WARNING, __file__, 1, "ignoring %s", (k,), None)
                for k in range(50)]
    assert sum(f.filter(r) for r in warnings) == 3  # warnings and errors are still throttled by template


def test_query_strings_never_reach_the_access_log():
    from rlgate.server.logging_filters import RedactQueryFilter

    r = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', (
        "127.0.0.1:5", "GET", "/v1/models?api_key=sk-secret", "1.1", 401), None)
    assert RedactQueryFilter().filter(r)
    assert "sk-secret" not in r.getMessage() and "/v1/models?<redacted>" in r.getMessage()


@contextmanager
def serve_with_fd_limit(model, nofile: int, *extra: str) -> Iterator[tuple[str, list[str]]]:
    port = free_port()
    log_path = f"/tmp/rlgate-fd-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model), "--engine", "fake", "--port", str(port),
         "--store", ":memory:", *extra],
        env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    try:
        wait_healthy(url, proc)
        yield url, lines
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
        lines.extend(open(log_path).read().splitlines())
        os.unlink(log_path)


@pytest.mark.slow
def test_file_descriptor_exhaustion_neither_floods_the_log_nor_stops_the_gateway(tiny_tokenizer_dir):
    """The landed gateway, at its open-file limit, stopped answering and wrote 255,136 "Too many
    open files" lines in a minute. Here 300 connections that never finish their headers hit a
    200-file limit: the log stays short and /health answers again within seconds."""
    with serve_with_fd_limit(tiny_tokenizer_dir, 200, "--header-timeout", "2") as (url, lines):
        host, port = url.removeprefix("http://").split(":")
        hogs = []
        for _ in range(300):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect((host, int(port)))
                s.sendall(b"GET /health HTTP/1.1\r\n")
            except OSError:
                s.close()
                continue
            hogs.append(s)
        t0 = time.monotonic()
        answered = None
        while time.monotonic() - t0 < 60 and answered is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    answered = time.monotonic() - t0
            except httpx.HTTPError:
                pass
        for s in hogs:
            s.close()
        assert answered is not None, "the gateway stopped answering"
    assert len(lines) < 500, f"{len(lines)} log lines"


def test_admin_route_with_a_session_key_still_reads_and_answers_403(make_app):
    app = make_app()
    with ServerThread(app) as url:
        with httpx.Client(base_url=url) as c:
            _, key = httpx_start_session(url)
            r = c.post("/rl/start_session", json={"task_id": "x"}, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 403


async def test_rate_limit_per_key_answers_429_with_retry_after(make_app, asgi_client):
    async with asgi_client(make_app(rate_limit_per_key=1.0, rate_limit_burst=3)) as c:
        _, key = await start_session(c)
        _, other = await start_session(c)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        statuses = [(await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}))
                    for _ in range(5)]
        assert [r.status_code for r in statuses] == [200, 200, 200, 429, 429]
        assert statuses[3].json()["error"]["code"] == "rate_limited"
        assert int(statuses[3].headers["retry-after"]) >= 1
        r = await c.post("/v1/messages", json=body, headers={"x-api-key": key})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        # another key has its own bucket
        r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {other}"})
        assert r.status_code == 200


def test_token_bucket_refills():
    from rlgate.core.rate_limit import RateLimiter
    from rlgate.errors import RateLimited

    now = [0.0]
    rl = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    rl.take("a")
    rl.take("a")
    with pytest.raises(RateLimited) as err:
        rl.take("a")
    assert err.value.retry_after == 1
    now[0] = 0.5  # one token back
    rl.take("a")
    now[0] = 100.0
    assert rl.prune() == 1 and len(rl) == 0


def test_oversized_headers_get_400_and_the_connection_closes(make_app):
    """httptools buffers a request's headers without a limit; the gateway caps them (64 KiB)."""
    app = make_app()
    with ServerThread(app) as url:
        big = b"X-Big: " + b"a" * (70 * 1024) + b"\r\n"
        got, data = raw_request(url, b"GET /health HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        assert got == 400, data[:300]
        assert b"connection: close" in data.lower()
        # sent slowly, in pieces, the same header is cut as soon as it passes the cap
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            try:
                for _ in range(16):  # 128 KiB of one header line, twice the cap, in pieces
                    s.sendall(b"a" * 8192)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = b""
            try:
                while not answer.endswith(b"too large."):  # the 400 comes without the header's end
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            except ConnectionResetError:
                pass
            assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        # headers just under the cap are served, and a kept-alive connection serves many requests
        ok = b"X-Ok: " + b"a" * (60 * 1024) + b"\r\n"
        got, data = raw_request(url, b"GET /health HTTP/1.1\r\nHost: x\r\n" + ok + b"\r\n")
        assert got == 200, data[:300]
        with httpx.Client(base_url=url) as c:
            for _ in range(5):
                assert c.get("/health", headers={"X-Ok": "a" * 30000}).status_code == 200


def test_pipelined_requests_are_answered_in_order(make_app):
    app = make_app()
    with ServerThread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
            data = b""
            deadline = time.monotonic() + 10
            while data.count(b"HTTP/1.1 200") < 3 and time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.count(b"HTTP/1.1 200") == 3, data[:500]


class _RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_a_response_head_leaves_with_its_body():
    import asyncio

    from rlgate.server.connections import _OneWriteResponses

    t = _RecordingTransport()
    w = _OneWriteResponses(t, asyncio.get_running_loop())  # type: ignore[arg-type]
    w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert t.writes == []  # held for the body
    w.write(b"{}")
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # interim answers are not held
    assert t.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n"
    w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")  # a stream whose first event is late
    await asyncio.sleep(0)  # the end of this loop iteration
    assert t.writes[-1].startswith(b"HTTP/1.1 200 OK") and len(t.writes) == 3
    w.write(b"HTTP/1.1 204 No Content\r\n\r\n")  # a response with no body, then the connection closes
    w.close()
    assert t.writes[-1] == b"HTTP/1.1 204 No Content\r\n\r\n" and t.closed


def _read_response(s: socket.socket) -> bytes:
    """What the server sends on ``s`` until one response is complete (or 30 s pass, or it closes)."""
    data = b""
    deadline = time.monotonic() + 30
    while not _complete(data) and time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_head_expect_continue_and_connection_close_still_answer(make_app):
    app = make_app()
    with ServerThread(app) as url:
        got, data = raw_request(url, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert got in (200, 405), data[:300]
        _, key = httpx_start_session(url)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(head)
            interim = s.recv(65536)
            assert interim.startswith(b"HTTP/1.1 100"), interim[:200]
            s.sendall(body)
            data = _read_response(s)
        assert data.startswith(b"HTTP/1.1 200"), data[:300]
        assert json_body(data)["usage"]["completion_tokens"] >= 1
        with httpx.Client(base_url=url, headers={"Connection": "close"}) as c:
            for _ in range(3):
                assert c.get("/health").status_code == 200


@pytest.mark.parametrize("why,extra_headers,length", [
    ("unknown key", b"Authorization: Bearer not-a-key-of-this-gateway\r\n", 1000),
    ("body over the limit", None, 5000),  # max_body_bytes=4096 below
])
def test_expect_continue_gets_the_refusal_before_sending_its_body(make_app, why, extra_headers, length):
    """A client that asked to continue is answered 401 / 413 at once, not told 100 Continue (it would
    upload a body the gateway then throws away)."""
    app = make_app(max_body_bytes=4096)
    with ServerThread(app) as url:
        if extra_headers is None:
            _, key = httpx_start_session(url)
            extra_headers = f"Authorization: Bearer {key}\r\n".encode()
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + extra_headers +
                b"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % length)
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(head)
            data = _read_response(s)
        status = {"unknown key": b"401", "body over the limit": b"413"}[why]
        assert data.startswith(b"HTTP/1.1 " + status), data[:300]
        assert b"100 Continue" not in data


def test_a_response_longer_than_the_header_timeout_is_not_cut(make_app, tokenizer):
    """The header timer guards the request's head only: a request whose body arrived in the same
    read as its headers (idle again at once) kept the timer armed, and a response still
    streaming when it fired was cut (the cluster's SSE streams through the router broke)."""
    from rlgate.engine.fake import FakeEngine

    app = make_app(FakeEngine(tokenizer, output_tokens=12, token_delay=0.1), header_timeout=0.3)
    with ServerThread(app) as url:
        _, key = httpx_start_session(url)
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post("/v1/chat/completions", json=body, headers=headers)  # ~1.2 s > 0.3 s
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12, r.text
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as s:
                text = "".join(s.iter_text())
            assert s.status_code == 200 and text.rstrip().endswith("data: [DONE]"), text[-300:]
            assert c.get("/health").status_code == 200  # the same kept-alive connection still serves
