"""A synthetic RL run recorded through a real gateway (scripted engine), for viewer tests,
benchmarks and the docs screenshot.

Every session is an episode of a GRPO group playing a calculator task over the OpenAI chat
surface: the policy calls the ``calculator`` tool, reads the result and answers. Some
episodes go wrong on purpose, the way real runs do: a tool call that does not parse, an
empty reply, a client that rewrites its history (a fork), an episode never rewarded. The
engine's weight version moves on between steps. Returns the exported samples with the
columns a training run's dumps carry (``session_id``, ``task_id``, ``group``, ``step``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from rlgate.config import GatewayConfig
from rlgate.engine.fake import FakeEngine
from rlgate.server.app import create_app
from rlgate.store.base import MemoryStore

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression with + - * and integers.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


EVERY_FAILURE = ("fork", "unparsed", "clean", "empty", "unrewarded", "wrong")


def _call(expr: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {json.dumps({"expression": expr})}}}\n</tool_call>'


async def synthetic_run(tokenizer: Any, stop_token_ids: list[int], *, groups: int = 50, group_size: int = 4,
                        seed: int = 0) -> list[dict[str, Any]]:
    """Record ``groups * group_size`` episodes in a fresh in-process gateway; return their exported
    samples (individual style)."""
    script: list[str] = []
    engine = FakeEngine(tokenizer, script=lambda req: script.pop(0) if script else "ok")
    admin = "synthetic-admin-key-" + "0" * 24
    app = create_app(GatewayConfig(admin_key=admin, tool_parser="hermes"), engine, MemoryStore(), tokenizer,
                     stop_token_ids=stop_token_ids)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        return await play(c, admin, script, engine.bump_version, groups=groups, group_size=group_size, seed=seed)


async def play(c: httpx.AsyncClient, admin_key: str, script: list[str], bump_version: Callable[[], Awaitable[int]],
               *, groups: int, group_size: int, seed: int = 0, export: bool = True) -> list[dict[str, Any]]:
    """Play the episodes against the gateway ``c`` talks to; the gateway's scripted engine pops its
    replies from ``script``. With ``export``, each session is exported (and gone); returns the samples."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    filler = ("so the result of the calculation is clear and I am sure that the answer is correct "
              "because I checked it twice").split()
    ah = {"Authorization": f"Bearer {admin_key}"}
    played = 0
    for g in range(groups):
        step = g // 8
        if g and g % 8 == 0:
            await bump_version()  # the trainer pushed new weights
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        members = []  # a group's episodes run side by side (as the rollout runner plays them)
        for _ in range(group_size):
            r = await c.post("/rl/start_session", json={"task_id": f"calc-{g}", "metadata": {"step": step}},
                             headers=ah)
            members.append((r.json()["session_id"], r.json()["api_key"]))
        for _sid, key in members:
            h = {"Authorization": f"Bearer {key}"}
            kind = rng.choices(["clean", "wrong", "unparsed", "empty", "fork", "unrewarded"], [60, 20, 6, 4, 6, 4])[0]
            if played < len(EVERY_FAILURE):  # every kind of failure shows up, whatever the seed
                kind = EVERY_FAILURE[played]
            played += 1
            right = a + b if kind != "wrong" else a + b + rng.randint(1, 9)
            words = " ".join(rng.choice(filler) for _ in range(12))
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a careful calculator agent."},
                {"role": "user", "content": f"What is {a} + {b}?"}]
            script.append(_call(f"{a} + {b}") if kind != "unparsed" else
                          f'<tool_call>\n{{"name": "calculator", "arguments": {{{a} + {b}}}}}\n</tool_call>')
            r = await c.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS}, headers=h)
            reply = r.json()["choices"][0]["message"]
            messages.append(reply)
            if reply.get("tool_calls"):
                messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": str(a + b)})
            else:
                messages.append({"role": "user", "content": "Please use the calculator tool."})
            if kind == "fork":  # the client drops the tool round trip and asks again
                messages = [messages[0], messages[1], {"role": "user", "content": "Just the number, please."}]
            script.append("" if kind == "empty" else f"{words}: {right}")
            await c.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS}, headers=h)
            if kind != "unrewarded":
                await c.post("/rl/set_reward", json={"reward": 1.0 if kind in ("clean", "fork") else 0.0}, headers=h)
            await c.post("/rl/end_session", headers=h)
        if export:
            for sid, _ in members:
                r = await c.post("/export_trajectories", json={"session_id": sid}, headers=ah)
                for s in r.json()["interactions"]:
                    rows.append({"session_id": sid, "task_id": f"calc-{g}", "group": f"calc-{g}", "step": step, **s})
    return rows
