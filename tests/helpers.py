"""Helpers shared by tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

ADMIN_KEY = "test-admin-key-0123456789abcdefghijklmnop"


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def key_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def start_session(client, task_id: str = "task", **body) -> tuple[str, str]:
    r = await client.post("/rl/start_session", json={"task_id": task_id, **body}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]
