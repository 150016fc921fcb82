"""Security properties: keys never logged, no default CORS, no public bind without a key."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from helpers import ADMIN_KEY, admin_headers, key_headers

OWN_KEY = "caller-chosen-session-key-" + "q" * 32
WRONG_KEY = "a-wrong-but-secret-looking-key-" + "w" * 32


async def full_session(c: httpx.AsyncClient) -> list[str]:
    """start, chat, stream (both surfaces), reward, end, export; also failed auth. Returns the keys used."""
    r = await c.post("/rl/start_session", json={"task_id": "leak"}, headers=admin_headers())
    sid, key = r.json()["session_id"], r.json()["api_key"]
    r = await c.post("/rl/start_session", json={"task_id": "own", "api_key": OWN_KEY}, headers=admin_headers())
    assert r.status_code == 200
    user = [{"role": "user", "content": "hi"}]
    assert (await c.post("/v1/chat/completions", json={"messages": user}, headers=key_headers(key))).status_code == 200
    async with c.stream("POST", "/v1/chat/completions", json={"messages": user, "stream": True},
                        headers=key_headers(key)) as s:
        assert s.status_code == 200
        await s.aread()
    async with c.stream("POST", "/v1/messages", json={"max_tokens": 5, "messages": user, "stream": True},
                        headers={"x-api-key": OWN_KEY}) as s:
        assert s.status_code == 200
        await s.aread()
    assert (await c.post("/v1/responses", json={"input": "hi"}, headers=key_headers(OWN_KEY))).status_code == 200
    assert (await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))).status_code == 200
    # failures: a wrong key, a session key on an admin route, the admin key as a session key
    assert (await c.post("/v1/chat/completions", json={"messages": user},
                         headers=key_headers(WRONG_KEY))).status_code == 401
    assert (await c.post("/grant_capacity", headers=key_headers(key))).status_code == 403
    assert (await c.post("/v1/messages", json={"max_tokens": 5, "messages": user},
                         headers={"x-api-key": ADMIN_KEY})).status_code == 401
    assert (await c.post("/rl/start_session", json={"task_id": "x", "api_key": "short"},
                         headers=admin_headers())).status_code == 400
    assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
    r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
    assert r.status_code == 200
    assert (await c.post("/v1/chat/completions", json={"messages": user},
                         headers=key_headers(key))).status_code == 401  # retired with the export
    return [key, OWN_KEY, ADMIN_KEY, WRONG_KEY]


def assert_no_keys(text: str, keys: list[str]) -> None:
    for k in keys:
        assert k not in text, f"a key appears in the logs: {k[:6]}..."
        assert k[:24] not in text  # not even a prefix


def test_keys_never_appear_in_logs_in_process(make_app, caplog):
    """uvicorn in-process, DEBUG on every logger, access log on; everything goes to caplog."""
    import uvicorn

    app = make_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, log_level="debug", access_log=True,
                            lifespan="on")
    server = uvicorn.Server(config)
    caplog.set_level(logging.DEBUG)  # root: every logger propagates here
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "rlgate", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]

    async def drive():
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
            return await full_session(c)

    try:
        keys = asyncio.run(drive())
    finally:
        server.should_exit = True
        thread.join(30)
    text = "\n".join(f"{r.name} {r.getMessage()} {r.args!r}" for r in caplog.records)
    assert "POST /v1/chat/completions" in text and "session leak-0 started" in text  # logging was on
    assert any(r.levelno == logging.DEBUG for r in caplog.records)
    assert_no_keys(text, keys)


@pytest.mark.slow
def test_keys_never_appear_in_logs_of_rlgate_serve(tiny_tokenizer_dir, tmp_path):
    """The real CLI's logging configuration: --log-level debug --access-log, stdout and stderr."""
    from helpers import free_port, wait_healthy

    port = free_port()
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}
    with open(log_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir),
                                 "--engine", "fake", "--port", str(port), "--store", str(tmp_path / "s.sqlite"),
                                 "--log-level", "debug", "--access-log"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc)

            async def drive():
                async with httpx.AsyncClient(base_url=url, timeout=300) as c:
                    keys = await full_session(c)
                    # keys in a query string (rlgate reads none from there) must not reach the access log
                    r = await c.post("/rl/start_session", json={"task_id": "q"}, headers=admin_headers())
                    key = r.json()["api_key"]
                    assert (await c.get(f"/v1/models?api_key={key}", headers=key_headers(key))).status_code == 200
                    r = await c.post(f"/v1/chat/completions?key={key}", json={"messages": [{"role": "user",
                                     "content": "hi"}]}, headers=key_headers(key))
                    assert r.status_code == 200
                    return [*keys, key]

            keys = asyncio.run(drive())
        finally:
            proc.terminate()
            proc.wait(300)
    text = log_path.read_text()
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in text and "DEBUG rlgate.generation: session" in text
    assert_no_keys(text, keys)
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.suffix != ".log")
    for k in keys:
        assert k.encode() not in blob  # nor in the store files


def test_trace_log_level_is_refused():
    """uvicorn's trace level logs raw request headers: the CLI does not offer it."""
    from rlgate.cli import add_serve_args

    p = argparse.ArgumentParser()
    add_serve_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--model", "m", "--log-level", "trace"])
    assert p.parse_args(["--model", "m", "--log-level", "DEBUG"]).log_level == "debug"


def test_non_loopback_bind_needs_an_explicit_admin_key(monkeypatch):
    from rlgate.cli import resolve_admin_key

    monkeypatch.delenv("RLGATE_ADMIN_KEY", raising=False)
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.com"):
        with pytest.raises(SystemExit, match="refusing to bind"):
            resolve_admin_key(argparse.Namespace(admin_key=None, host=host))
    for host in ("127.0.0.1", "::1", "localhost"):
        key, generated = resolve_admin_key(argparse.Namespace(admin_key=None, host=host))
        assert generated and len(key) >= 40
    assert resolve_admin_key(argparse.Namespace(admin_key=ADMIN_KEY, host="0.0.0.0")) == (ADMIN_KEY, False)
    monkeypatch.setenv("RLGATE_ADMIN_KEY", ADMIN_KEY)
    assert resolve_admin_key(argparse.Namespace(admin_key=None, host="0.0.0.0")) == (ADMIN_KEY, False)


PREFLIGHT = {"Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


async def test_no_cors_unless_configured(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        r = await c.options("/v1/chat/completions", headers=PREFLIGHT)
        assert r.status_code in (400, 405) and not any(h.startswith("access-control-") for h in r.headers)
        r = await c.get("/health", headers={"Origin": "https://ui.example"})
        assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)


async def test_cors_for_configured_origins_only(make_app, asgi_client):
    async with asgi_client(make_app(cors_origins=["https://ui.example"])) as c:
        r = await c.options("/v1/chat/completions", headers=PREFLIGHT)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ui.example"
        r = await c.get("/health", headers={"Origin": "https://ui.example"})
        assert r.headers["access-control-allow-origin"] == "https://ui.example"
        r = await c.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        r = await c.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
        # CORS does not replace auth
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers={"Origin": "https://ui.example"})
        assert r.status_code == 401


def test_ignored_parameter_names_are_made_safe_for_headers_and_logs(make_app):
    """Unknown field names are client-chosen text: escaped, truncated, counted (the fuzzer found a 500 here)."""
    from rlgate.api.common import report_ignored

    header = report_ignored("chat", ["ok_name", "é\n,x", "\ud800"] + [f"f{k}" for k in range(40)])
    value = header["x-rlgate-ignored-params"]
    value.encode("ascii")
    assert value.split(",")[:3] == ["ok_name", r"\u00e9\n\u002cx", r"\ud800"]
    assert value.endswith("...(+11)")
    assert json.dumps(value).isascii()


def test_a_long_escaped_parameter_name_is_cut_between_escapes():
    import re

    from rlgate.api.common import _param_name

    for name in ("a" * 61 + "é" * 3, "é" * 40, "\ud800" * 20, "x," * 40, "b" * 59 + "\n" * 5):
        shown = _param_name(name)
        assert len(shown) <= 64 and shown.isascii() and shown.isprintable()
        assert re.fullmatch(r"(?:[^\\]|\\u[0-9a-f]{4}|\\[nrtbf\\\"])*", shown), shown  # whole escapes only
        assert json.loads(f'"{shown}"') == name[:len(json.loads(f'"{shown}"'))]


# --------------------------------------------------------------------------- hostile input

SURFACE_BODIES = {
    "/v1/chat/completions": b'{"messages": [{"role": "user", "content": %s}], "max_tokens": 3%s}',
    "/v1/responses": b'{"input": %s, "max_output_tokens": 3%s}',
    "/v1/messages": b'{"max_tokens": 3, "messages": [{"role": "user", "content": %s}]%s}',
}
HOSTILE = [
    ("lone surrogate", b'"\\ud800 hi"', b""),
    ("lone low surrogate in a field name", b'"hi"', b', "\\udfff": 1'),
    ("utf-8 encoded surrogate", b'"\xed\xa0\x80"', b""),
    ("NaN", b'"hi"', b', "temperature": NaN'),
    ("Infinity", b'"hi"', b', "top_p": Infinity'),
    ("overflowing float", b'"hi"', b', "temperature": 1e400'),
    ("deep nesting", b'"hi"', b', "metadata": ' + b"[" * 100_000 + b"]" * 100_000),
    ("field name for header injection", b'"hi"', b', "x\\r\\nSet-Cookie: a": 1, "\\u00e9\\u4e2d": 2'),
    ("thousands of unknown fields", b'"hi"', b"".join(b', "f%d": %d' % (k, k) for k in range(5000))),
]


@pytest.mark.parametrize("path", list(SURFACE_BODIES))
@pytest.mark.parametrize("name,content,extra", HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_bodies_get_4xx_in_the_surface_shape(make_app, asgi_client, path, name, content, extra):
    async with asgi_client(make_app()) as c:
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
        key = r.json()["api_key"]
        h = {**key_headers(key), "content-type": "application/json"}
        r = await c.post(path, content=SURFACE_BODIES[path] % (content, extra), headers=h)
        assert r.status_code < 500, r.text
        if r.status_code == 200:  # accepted: unknown fields are reported in a safe header
            value = r.headers["x-rlgate-ignored-params"]
            assert value.isascii() and "\r" not in value and "\n" not in value and len(value) < 4096
            assert "set-cookie" not in r.headers
        else:
            assert r.status_code == 400
            body = r.json()
            if path == "/v1/messages":
                assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            else:
                assert body["error"]["code"] in ("invalid_json", "invalid_unicode")
        ok = await c.post(path, content=SURFACE_BODIES[path] % (b'"hi"', b""), headers=h)
        assert ok.status_code == 200  # and the server keeps serving


@pytest.mark.parametrize("path,body", [
    ("/rl/start_session", b'{"task_id": "\\ud800"}'),
    ("/rl/start_session", b"[" * 100_000 + b"]" * 100_000),
    ("/rl/set_reward", b'{"reward": NaN, "session_id": "x"}'),
    ("/export_trajectories", b'{"session_id": "t-0", "discount": Infinity}'),
])
async def test_hostile_control_bodies_get_4xx(make_app, asgi_client, path, body):
    async with asgi_client(make_app()) as c:
        r = await c.post(path, content=body, headers={**admin_headers(), "content-type": "application/json"})
        assert 400 <= r.status_code < 500 and set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body,param", [
    (b'{"task_id": "t", "metadata": {"x": NaN}}', "metadata"),  # json.loads takes these; the store wrote null
    (b'{"task_id": "t", "metadata": {"a": [1, {"y": -Infinity}]}}', "metadata"),
    (b'{"task_id": "t", "metadata": {"z": 1e999}}', "metadata"),
    (b'{"task_id": "a\\nb\\r\\nINFO forged line"}', "task_id"),  # written to the log as is
    (b'{"task_id": "a\\u0000b"}', "task_id"),
    (b'{"task_id": "t", "api_key": "' + b" " * 40 + b'"}', "api_key"),  # keys no client can send back
    (b'{"task_id": "t", "api_key": " ' + b"y" * 40 + b'"}', "api_key"),
    (b'{"task_id": "t", "api_key": "' + "ключ".encode() * 10 + b'"}', "api_key"),
    (b'{"task_id": "t", "api_key": "' + b"x" * 31 + b'\\t"}', "api_key"),
])
async def test_start_session_refuses_what_it_could_not_keep_or_log_safely(make_app, asgi_client, body, param):
    async with asgi_client(make_app()) as c:
        r = await c.post("/rl/start_session", content=body,
                         headers={**admin_headers(), "content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        ok = await c.post("/rl/start_session", json={"task_id": "t", "metadata": {"x": 1.5}}, headers=admin_headers())
        assert ok.status_code == 200 and ok.json()["session_id"] == "t-0"  # nothing was started before


@pytest.mark.slow
def test_admin_key_file_data_dir_and_an_unusable_store(tiny_tokenizer_dir, tmp_path):
    """Issue 15: --admin-key-file followed symlinks; --data-dir parents followed the umask; an
    unusable store printed a raw traceback."""
    from helpers import free_port, wait_healthy

    target = tmp_path / "readable-by-all.txt"
    target.write_text("public\n")
    target.chmod(0o644)
    link = tmp_path / "admin.key"
    link.symlink_to(target)
    data_dir = tmp_path / "a" / "b" / "c"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RLGATE_STORE"}
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir),
                             "--engine", "fake", "--port", str(port), "--admin-key-file", str(link),
                             "--data-dir", str(data_dir)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: os.umask(0o022))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait(30)
    assert target.read_text() == "public\n", "the admin key was written through the symlink"
    assert not link.is_symlink() and (link.stat().st_mode & 0o777) == 0o600
    key = link.read_text().strip()
    assert len(key) >= 40
    for d in (tmp_path / "a", tmp_path / "a" / "b", data_dir):
        assert (d.stat().st_mode & 0o777) == 0o700, (d, oct(d.stat().st_mode))

    garbage = tmp_path / "garbage.sqlite"
    garbage.write_text("this is not a database")
    for store in (garbage, tmp_path):  # not a database; a directory
        r = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir),
                            "--engine", "fake", "--port", str(free_port()), "--store", str(store)],
                           env={**env, "RLGATE_ADMIN_KEY": ADMIN_KEY}, capture_output=True, text=True, timeout=300)
        assert r.returncode != 0
        assert "Traceback" not in r.stderr + r.stdout, r.stderr[-2000:]
        (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("rlgate:")]
        assert str(store) in line
