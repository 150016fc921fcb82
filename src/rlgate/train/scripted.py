"""``gateway.engine: scripted``: the run's in-process gateway answers from a script, not a model.

For ``rlgate check`` and ``rlgate train`` without a checkpoint that can drive the agent: a
tool-using agent's whole loop — its requests, the tool calls parsed from the replies, the tool
results, the recorded samples, the reward — runs offline in seconds. ``gateway.script``:

* ``tools`` (default): a generic tool round (:class:`rlgate.engine.fake.ToolRoundScript`): when
  the prompt lists tools and the last user turn holds no tool result, call the first listed tool
  with arguments made from its JSON schema (every required string ``"ls"``); otherwise answer
  ``Done.``;
* a file: a JSON or YAML list of replies, or JSON lines (each a string or ``{"reply": ...}``),
  served in order and over again; a tool call is written as the model would write it (the
  in-process gateway's ``tool_parser``; Hermes: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``);
* ``module:fn``: ``fn(prompt) -> str`` with the rendered prompt as text (special tokens kept),
  imported from the current directory like the agent.

The recorded logprobs are the fake engine's (a deterministic function of token and position),
not the model's: a scripted run checks the plumbing, and its loss and KL mean nothing. Weight
pushes only bump the version.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rlgate.engine.base import GenerateRequest
from rlgate.engine.fake import FakeEngine, ScriptItem, ToolRoundScript
from rlgate.train.config import ConfigError

Script = Callable[[GenerateRequest], ScriptItem]


def _replies_from_file(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    elif path.suffix == ".json":
        items = json.loads(text)
    else:
        items = yaml.safe_load(text)
    if not isinstance(items, list) or not items:
        raise ValueError("expected a non-empty list of replies")
    replies: list[str] = []
    for i, item in enumerate(items):
        reply = item.get("reply") if isinstance(item, dict) else item
        if not isinstance(reply, str):
            raise ValueError(f"reply {i} is not text (a string or {{\"reply\": string}})")
        replies.append(reply)
    return replies


def load_script(spec: str | None, tokenizer: Any) -> Script:
    """The engine's script for ``gateway.script`` (see the module docstring); ConfigError naming it."""
    if spec is None or spec == "tools":
        return ToolRoundScript(tokenizer)
    path = Path(spec)
    if path.is_file():
        try:
            replies = _replies_from_file(path)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"gateway.script: {spec}: {exc}") from None
        cycle = itertools.cycle(replies)
        return lambda request: next(cycle)
    if ":" not in spec or "/" in spec:
        raise ConfigError(f"gateway.script: {spec!r} is no file (looked in {Path.cwd()}), 'tools' or module:fn")
    from rlgate.train.loading import import_object

    fn = import_object(spec, "gateway.script")
    if not callable(fn):
        raise ConfigError(f"gateway.script: {spec} is not callable; expected fn(prompt) -> str")

    def call(request: GenerateRequest) -> ScriptItem:
        reply = fn(tokenizer.decode(request.input_ids, skip_special_tokens=False))
        if not isinstance(reply, str):
            raise TypeError(f"gateway.script {spec} returned {type(reply).__name__}, not text")
        return reply

    return call


def scripted_engine(spec: str | None, tokenizer: Any, context_length: int) -> FakeEngine:
    return FakeEngine(tokenizer, script=load_script(spec, tokenizer), max_context_length=context_length,
                      token_delay=0.0)


class VersionSync:
    """Weight sync for the scripted engine: nothing to load, the version goes up."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    async def push(self, model: Any) -> int:
        return await self.engine.bump_version()
