"""Helpers shared by tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

ADMIN_KEY = "test-admin-key-0123456789abcdefghijklmnop"


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def key_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def start_session(client, task_id: str = "task", **body) -> tuple[str, str]:
    r = await client.post("/rl/start_session", json={"task_id": task_id, **body}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    """Poll ``url/health`` until 200; fail early (with its output, if piped) when ``proc`` exits."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"{url}: the server exited early with {proc.returncode}:\n{out}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become healthy")


async def eventually(condition: Callable[[], Any], *, timeout: float = 600.0, interval: float = 0.01,
                     what: str = "the condition") -> None:
    """Wait until ``condition()`` (or the coroutine it returns) is true. The timeout only stops a
    test that would otherwise hang: it is far above what the condition needs on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        ok = condition()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not become true within {timeout:.0f} s")
        await asyncio.sleep(interval)
