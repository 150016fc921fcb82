"""Running the real ``rlgate`` CLI on a config in a scratch directory (tests of train / check / eval)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

# Agents the tests train with, written next to the config as agents.py (so they are imported
# from the current directory, as a user's would be).
AGENTS = '''
import asyncio
import math

from openai import AsyncOpenAI


async def _ask(data, base_url, api_key, http_client=None):
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
    try:
        r = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": data["question"]}],
            max_tokens=int(data.get("max_tokens", 4)), temperature=float(data.get("temperature", 1.0)))
    finally:
        if http_client is None:
            await client.close()
    return r.choices[0].message.content or ""


class LengthAgent:
    """Reward = parity of the reply's length: varies within groups."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        return float(len(await _ask(data, base_url, api_key, http_client)) % 2)


class RayTaskAgent(LengthAgent):
    """A LengthAgent that leaves a file named by its Ray task id in data["marks"] (rollout mode ray)."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        import pathlib

        import ray

        pathlib.Path(data["marks"], ray.get_runtime_context().get_task_id()).touch()
        return await super().run(data, base_url=base_url, api_key=api_key, http_client=http_client)


class CrashingAgent:
    async def run(self, data, *, base_url, api_key, http_client=None):
        await _ask(data, base_url, api_key, http_client)
        raise ValueError("the tool server is down")


class ReturnsNone:
    async def run(self, data, *, base_url, api_key, http_client=None):
        await _ask(data, base_url, api_key, http_client)


class ReturnsText:
    async def run(self, data, *, base_url, api_key, http_client=None):
        return await _ask(data, base_url, api_key, http_client)


class ReturnsNaN:
    async def run(self, data, *, base_url, api_key, http_client=None):
        await _ask(data, base_url, api_key, http_client)
        return math.nan


class WrongSignature:
    async def run(self, question):
        return 1.0


class NoCalls:
    async def run(self, data, *, base_url, api_key, http_client=None):
        return 1.0


async def function_agent(data, *, base_url, api_key):
    return float(len(await _ask(data, base_url, api_key)) % 2)


NOT_AN_AGENT = {"run": "nope"}


def reply_length_parity(episode):
    return float(len(episode.final_text) % 2)
'''


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def text(self) -> str:
        return self.out + self.err


def write_workdir(root: Path, model_dir: Path, n_items: int = 24) -> Path:
    (root / "agents.py").write_text(AGENTS)
    with (root / "train.jsonl").open("w") as f:
        for a in range(10, 10 + n_items):
            f.write(json.dumps({"question": f"Which is larger, {a} or {a + 3}?", "answer": str(a + 3)}) + "\n")
    (root / "model").symlink_to(model_dir)
    return root


def base_config(**over) -> dict:
    cfg = {
        "model": "model", "out_dir": "run", "dataset": "train.jsonl", "agent": "agents:LengthAgent",
        "steps": 1, "checkpoint_every": 1,
        "grpo": {"lr": 1e-4, "groups_per_step": 2, "micro_batch_size": 8, "device": "cpu"},
        "rollout": {"group_size": 2, "concurrency": 8, "max_consecutive_failures": 4},
        "tracking": {"plot": False},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


def rlgate(workdir: Path, *args: str, config: dict | None = None, timeout: float = 1200, env: dict | None = None
           ) -> Result:
    """Run ``rlgate ARGS`` in ``workdir`` (writing ``config`` to cfg.yaml first); the time it took to exit,
    measured by waiting on the process."""
    if config is not None:
        (workdir / "cfg.yaml").write_text(yaml.safe_dump(config))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlgate.cli", *args], cwd=workdir, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    return Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
