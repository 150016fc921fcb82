"""What the tests say to the gateway and read back: a chat call, SSE streams parsed."""

from __future__ import annotations

import json
from typing import Any

from helpers import key_headers


def chat_call(key: str, messages: list[dict], **body: Any) -> dict[str, Any]:
    """The arguments of ``client.post(**chat_call(...))`` for one chat completion (sync or async client)."""
    return {"url": "/v1/chat/completions", "json": {"messages": messages, **body}, "headers": key_headers(key)}


async def chat(c: Any, key: str, messages: list[dict], **body: Any) -> dict:
    """One non-streamed chat completion that must succeed; its JSON."""
    r = await c.post(**chat_call(key, messages, **body))
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(text: str) -> list[tuple[str, dict]]:
    """A stream of ``event:`` + ``data:`` frames (Anthropic messages, OpenAI responses) -> [(event, data)],
    checking the framing: two lines per frame, and the data's ``type`` (when it has one) is the event name."""
    events = []
    for frame in text.strip().split("\n\n"):
        lines = frame.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data.get("type", name) == name, frame
        events.append((name, data))
    return events


def sse_data(text: str, *, done: bool = False) -> list[dict]:
    """The JSON of every ``data:`` line of a stream (any surface), without the final ``[DONE]``;
    ``done=True``: the stream must end with ``data: [DONE]`` (OpenAI chat completions)."""
    lines = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    if done:
        assert lines and lines[-1] == "[DONE]", text[-200:]
    return [json.loads(line) for line in lines if line != "[DONE]"]
