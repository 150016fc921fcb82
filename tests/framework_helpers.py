"""What the agent-framework tests share: a scripted engine by turn, a live gateway that logs what it
reported per request, the export, and a framework's script run in its own environment
(tests/framework_envs.py) as a subprocess against the gateway on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from helpers import admin_headers, key_headers, start_session
from rlgate.engine.base import GenerateRequest
from rlgate.server.runner import ServerThread

SCRIPTS = Path(__file__).parent / "frameworks"


def call_text(name: str, args: dict[str, Any]) -> str:
    """A Hermes tool call as the tiny model's template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


ADD_CALL = call_text("add", {"a": 1, "b": 2})
THINK_CALL = "<think>I should add.</think>" + ADD_CALL


class Turns:
    """Replies by turn: the n-th request of the session gets ``replies[n]`` (the last one after that)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, request: GenerateRequest) -> str:
        with self.lock:
            reply = self.replies[min(self.n, len(self.replies) - 1)]
            self.n += 1
        return reply


class HeaderLog:
    """The gateway app, logging each answer's path, status and ``x-rlgate-ignored-params`` as the client got
    them (``app.state`` passes through, so the gateway is served exactly as without the log)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state
        self.seen: list[tuple[str, int, str | None]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def logged(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
                self.seen.append((scope["path"], message["status"], headers.get("x-rlgate-ignored-params")))
            await send(message)

        await self.app(scope, receive, logged)

    def ignored(self) -> list[str]:
        """Every parameter named as not acted on, over the session's model calls, sorted."""
        return sorted({p for _, _, h in self.seen if h for p in h.split(",")})

    def statuses(self, prefix: str = "/v1/") -> list[int]:
        return [s for path, s, _ in self.seen if path.startswith(prefix)]


@contextlib.asynccontextmanager
async def gateway(app: Any) -> AsyncIterator[tuple[str, httpx.AsyncClient, str, str, HeaderLog]]:
    """``(url, admin client, session id, session key, header log)`` on a live server."""
    log = HeaderLog(app)
    with ServerThread(log) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
            sid, key = await start_session(admin, "framework")
            yield url, admin, sid, key, log


async def export(admin: httpx.AsyncClient, sid: str, key: str) -> dict:
    await admin.post("/rl/end_session", headers=key_headers(key))
    r = await admin.post("/export_trajectories", json={"session_id": sid, "style": "concat"},
                         headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


def stats(exp: dict) -> tuple[int, int, int]:
    s = exp["stats"]
    return s["completed"], s["fork"], s["conversations"]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A subprocess environment with nothing of the test's (no PYTHONPATH: tests/no_torch must not reach
    another venv), a throwaway HOME, offline settings, and ``extra``."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


async def run_script(python: Path, script: str, *args: str, home: Path, env: dict[str, str] | None = None,
                     timeout: float = 600) -> dict:
    """Run ``tests/frameworks/<script>`` with an environment's interpreter; its last stdout line, as JSON
    (the assertion message carries its output when there is none)."""
    home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(python), str(SCRIPTS / script), *args, cwd=home, env=clean_env(home, **(env or {})),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    lines = out.decode().strip().splitlines()
    assert proc.returncode == 0 and lines, (proc.returncode, out.decode()[-2000:], err.decode()[-4000:])
    return json.loads(lines[-1])


def record(record_property: Any, framework: str, versions: dict[str, str], env: str) -> None:
    """Name the framework and the versions a test ran for the table printed after the run (conftest.py)."""
    record_property("framework", json.dumps({"framework": framework, "versions": versions, "env": env}))
