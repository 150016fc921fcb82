"""End to end: the real OpenAI and Anthropic SDKs against ``rlgate serve --online`` on 127.0.0.1 (fake
engine, tiny tokenizer, a SQLite store): tenant keys, conversations, feedback of every kind, an implicit
signal, keys refused before a body is read, and a deletion that leaves nothing in the store file."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys

import anthropic
import httpx
import openai
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, admin_headers, eventually, free_port, wait_healthy

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tiny_tokenizer_dir, tmp_path):
    port = free_port()
    store = tmp_path / "online.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--store", str(store),
         "--online", "--implicit-scan-interval", "0.05"],
        env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, port, store
    finally:
        proc.terminate()
        proc.wait(120)


def early_answer(port: int, path: str, key: str | None) -> bytes:
    """Send a request that declares a 100 MB body and sends none: only an answer made from the headers
    alone can come back (the connection is then closed)."""
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
                  + b"Content-Length: 100000000\r\n\r\n")
        head = s.recv(65536)
        return head.split(b"\r\n", 1)[0]


async def test_online_serving_with_the_real_sdks(served):
    url, port, store = served
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/tenants", json={"name": "shop"}, headers=admin_headers())
        tid, key = r.json()["id"], r.json()["api_key"]
        r = await http.post("/v1/tenants", json={"name": "bank"}, headers=admin_headers())
        other_id, other_key = r.json()["id"], r.json()["api_key"]
        tenant = {"Authorization": f"Bearer {key}"}

        oai = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                          default_headers={"X-Conversation-Id": "support-42"})
        messages = [{"role": "user", "content": "my order is late"}]
        first = await oai.chat.completions.create(model="m", messages=messages, max_tokens=8)
        again = await oai.chat.completions.create(model="m", messages=messages, max_tokens=8)  # regenerate
        follow = messages + [{"role": "assistant", "content": again.choices[0].message.content},
                             {"role": "user", "content": "thanks"}]
        second = await oai.chat.completions.create(model="m", messages=follow, max_tokens=8)
        claude = AsyncAnthropic(base_url=url, api_key=key, max_retries=0,
                                default_headers={"X-Conversation-Id": "claude-7"})
        reply = await claude.messages.create(model="m", max_tokens=8,
                                             messages=[{"role": "user", "content": "summarise"}])
        assert reply.id.startswith("msg_")

        posts = [
            {"kind": "thumbs", "value": True, "interaction_id": second.id},
            {"kind": "preference", "value": 1, "interaction_id": again.id, "other_interaction_id": first.id},
            {"kind": "rating", "value": 4, "interaction_id": reply.id},
            {"kind": "comment", "value": "polite", "conversation_id": "support-42"},
            {"kind": "outcome", "value": 1.0, "conversation_id": "support-42", "source": "delayed"},
        ]
        for body in posts:
            r = await http.post("/v1/feedback", json=body, headers=tenant)
            assert r.status_code == 200, r.text
        assert r.json()["reward"] == 1.0

        async def regenerate_seen() -> bool:
            r = await http.get("/v1/feedback", params={"conversation_id": "support-42"}, headers=tenant)
            return ("regenerate", first.id) in {(e["value"], e["interaction_id"]) for e in r.json()["data"]}

        await eventually(regenerate_seen, timeout=120, interval=0.05, what="the implicit regenerate signal")

        # the other tenant: its key works for itself, never on the first tenant's turns
        other = AsyncOpenAI(base_url=url + "/v1", api_key=other_key, max_retries=0,
                            default_headers={"X-Conversation-Id": "support-42"})
        mine = await other.chat.completions.create(model="m", messages=messages, max_tokens=4)
        r = await http.post("/v1/feedback", json={"kind": "thumbs", "value": False, "interaction_id": first.id},
                            headers={"Authorization": f"Bearer {other_key}"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        r = await http.post("/v1/data/delete", json={"conversation_id": "support-42", "tenant_id": tid},
                            headers={"Authorization": f"Bearer {other_key}"})
        assert r.status_code == 403

        # keys are checked before a body is read
        assert early_answer(port, "/v1/feedback", None).startswith(b"HTTP/1.1 401")
        assert early_answer(port, "/v1/chat/completions", "rlg-tenant-guessed-0123456789").startswith(b"HTTP/1.1 401")
        assert early_answer(port, "/v1/tenants", key).startswith(b"HTTP/1.1 403")
        with pytest.raises(openai.AuthenticationError):
            await AsyncOpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
                model="m", messages=messages)
        r = await http.post("/v1/tenants/revoke", json={"tenant_id": other_id}, headers=admin_headers())
        assert r.status_code == 200
        assert early_answer(port, "/v1/messages", other_key).startswith(b"HTTP/1.1 401")
        with pytest.raises(anthropic.AuthenticationError):
            await AsyncAnthropic(base_url=url, api_key=other_key, max_retries=0).messages.create(
                model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])

        metrics = (await http.get("/metrics", headers=admin_headers())).text
        assert 'rlgate_online_turns_total{policy_version="0"}' in metrics
        assert 'rlgate_feedback_events_total{kind="implicit",source="implicit"}' in metrics

        # the conversation is deleted: nothing of it in the store file (read by another process's connection)
        ids = (first.id, again.id, second.id)
        r = await http.post("/v1/data/delete", json={"conversation_id": "support-42"}, headers=tenant)
        assert r.status_code == 200 and sorted(r.json()["interaction_ids"]) == sorted(ids)
        with sqlite3.connect(store) as db:
            marks = ", ".join("?" * len(ids))
            assert db.execute(f"SELECT COUNT(*) FROM interactions WHERE id IN ({marks})", ids).fetchone() == (0,)
            assert db.execute("SELECT COUNT(*) FROM feedback WHERE tenant=? AND conversation_id='support-42'",
                              (tid,)).fetchone() == (0,)
            assert db.execute("SELECT COUNT(*) FROM interactions WHERE id IN (?, ?)",
                              (reply.id, mine.id)).fetchone() == (2,)  # the others' stay
        r = await http.get("/v1/feedback", params={"tenant_id": tid}, headers=admin_headers())
        assert [e["interaction_id"] for e in r.json()["data"]] == [reply.id]
        await oai.close()
        await other.close()
        await claude.close()
