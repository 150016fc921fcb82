"""Agent frameworks with their default settings against a gateway on 127.0.0.1 (docs/agents.md).

Each test runs the real package (skipped, saying why, when it is not installed), plays one tool
round with the fake engine and counts the conversations the session records: one conversation
per episode is the goal (a fork breaks the token chain the trainer learns from).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from typing import Any

import httpx
import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.engine.base import GenerateRequest
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread


def call_text(name: str, args: dict[str, Any]) -> str:
    """A Hermes tool call as the tiny model's template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


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


@contextlib.asynccontextmanager
async def gateway(app):
    """``(url, admin client, session id, session key)`` on a live server."""
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
            sid, key = await start_session(admin, "framework")
            yield url, admin, sid, key


async def export(admin, sid, key) -> dict:
    await admin.post("/rl/end_session", headers=key_headers(key))
    r = await admin.post("/export_trajectories", json={"session_id": sid, "style": "concat"},
                         headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


# --------------------------------------------------------------------------- smolagents


async def test_smolagents_tool_calling_agent_is_one_conversation(make_app, tokenizer):
    """smolagents 1.26 ToolCallingAgent re-sends the model's tool calls as assistant text
    ("Calling tools:\\n[{'id': ..., 'function': {...}}]") and the results as user messages
    ("Observation:\\n..."): the smolagents matcher finds the model's own calls in that text by their
    ids, so every turn extends its parent (before: every follow-up forked with no_prefix_match)."""
    smolagents = pytest.importorskip("smolagents", reason="smolagents is not installed (pip install smolagents)")
    import asyncio

    engine = FakeEngine(tokenizer, script=Turns([
        call_text("add", {"a": 1, "b": 2}), call_text("add", {"a": 3, "b": 4}),
        call_text("final_answer", {"answer": "3 and 7"})]), max_context_length=65536)
    async with gateway(make_app(engine)) as (url, admin, sid, key):

        @smolagents.tool
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first integer
                b: the second integer
            """
            return a + b

        model = smolagents.OpenAIModel(model_id="tiny", api_base=url + "/v1", api_key=key)
        agent = smolagents.ToolCallingAgent(tools=[add], model=model, max_steps=5, verbosity_level=0)
        answer = await asyncio.to_thread(agent.run, "What are 1 + 2 and 3 + 4?")
        exp = await export(admin, sid, key)
    assert answer == "3 and 7"
    stats = exp["stats"]
    assert (stats["completed"], stats["fork"], stats["conversations"]) == (3, 0, 1), stats
    (sample,) = exp["interactions"]
    assert len(sample["chain"]) == 3
    # one token sequence: each prompt is the previous prompt + the model's own call tokens + the observation
    # rendered as the user turn smolagents sent; every generated token under loss
    ids, mask = sample["input_ids"], sample["loss_mask"]
    runs = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
    assert runs == [len(r.input_ids) for r in engine.requests]
    assert all(ids[: len(r.input_ids)] == r.input_ids for r in engine.requests)
    ends = [k for k in range(1, len(mask)) if mask[k - 1] and not mask[k]]
    assert all("Observation:" in tokenizer.decode(ids[e:r]) for e, r in zip(ends, runs[1:], strict=True))
    assert sample["messages"][2]["content"].startswith("Calling tools:\n[{'id': 'call_")  # recorded as sent


# --------------------------------------------------------------------------- mini-swe-agent


def _mini() -> list[str]:
    from rlgate.agents.mini_swe_agent import MiniNotFound, ensure_mini

    try:
        return ensure_mini()
    except (MiniNotFound, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"mini-swe-agent is not installable here: {exc}")


async def test_mini_swe_agent_episode_with_its_defaults(make_app, tokenizer):
    """mini-swe-agent 2.4 (the real package, its own venv) plays one episode with the harness: one bash
    command, then it submits. Offline, without a terminal, with its default config (issue 26: its setup
    wizard aborted without a terminal, and the first call raised a cost-calculation error)."""
    from rlgate.agents.mini_swe_agent import MiniSweAgent

    exe = _mini()
    engine = FakeEngine(tokenizer, script=Turns([
        "I will look.\n" + call_text("bash", {"command": "echo hi > made_by_agent.txt && ls"}),
        "Done.\n" + call_text("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]),
        max_context_length=65536)
    seen: dict[str, Any] = {}

    def verify(workdir, transcript, data):
        seen["file"] = (workdir / "made_by_agent.txt").read_text() if (workdir / "made_by_agent.txt").exists() else None
        seen["transcript"] = transcript
        return 1.0 if seen["file"] == "hi\n" else 0.0

    agent = MiniSweAgent(verifier=verify, executable=exe, model="tiny", time_limit=300)
    async with gateway(make_app(engine)) as (url, admin, sid, key):
        reward = await agent.run({"prompt": "Create made_by_agent.txt."}, base_url=url, api_key=key)
        exp = await export(admin, sid, key)
    t = seen["transcript"]
    assert reward == 1.0, (t.returncode, t.stdout[-3000:], t.stderr[-3000:])
    assert t.returncode == 0 and not t.timed_out
    stats = exp["stats"]
    assert (stats["completed"], stats["fork"], stats["conversations"]) == (2, 0, 1), stats
