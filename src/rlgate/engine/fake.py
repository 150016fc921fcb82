"""A scripted, deterministic engine for tests and for measuring gateway overhead.

Outputs come from a *script*: a list consumed one item per request (or a callable
``request -> item``). An item is

* ``str``: text, encoded with the tokenizer, followed by the first stop token;
* ``list[int]``: token ids used verbatim (add the stop token yourself if wanted);
* :class:`Scripted`: ids or text with an explicit finish.

With no script (or once it is used up) every request gets ``output_tokens`` tokens
ending in the stop token. Logprobs are a deterministic function of token and
position, always finite and ≤ 0. Every request received is kept in ``requests``.

LoRA adapters (``capabilities.ServesAdapters``) are bookkeeping only: a directory is checked as
every engine checks it and the adapter's version counted; a request naming an adapter gets the same
script, its tokens tagged with that adapter's version (a script callable can read ``request.adapter``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlgate.engine.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    StreamingEngineMixin,
    TokenDelta,
)
from rlgate.engine.options import EngineOptions
from rlgate.engine.weights_path import adapter_dir, checkpoint_dir

_FILLER = " the quick brown fox jumps over the lazy dog and runs away"
KEEP_REQUESTS = 10_000  # FakeEngine.requests keeps at most this many (oldest dropped in halves)


@dataclass
class Scripted:
    text: str | None = None
    ids: list[int] | None = None
    add_stop: bool = True  # append the first stop token (text items only)


ScriptItem = str | list[int] | Scripted


def fake_logprob(token_id: int, position: int) -> float:
    return -(((token_id * 7919 + position * 104729) % 1000) / 250.0) - 0.001


class FakeEngine(StreamingEngineMixin):
    def __init__(
        self,
        tokenizer: Any = None,
        *,
        script: list[ScriptItem] | Callable[[GenerateRequest], ScriptItem] | None = None,
        output_tokens: int = EngineOptions.fake_output_tokens,
        max_context_length: int = 2048,
        token_delay: float = EngineOptions.fake_token_delay,
        prefill_delay: float = 0.0,
        fail_with: EngineError | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.output_tokens = output_tokens
        self._max_ctx = max_context_length
        self.token_delay = token_delay  # seconds between streamed tokens (0: instant)
        self.prefill_delay = prefill_delay  # seconds before the first token (a long prompt's prefill)
        self.fail_with = fail_with  # raise this from every request (error-path tests)
        # the requests received, for tests to inspect: the last KEEP_REQUESTS at most (a
        # long-running `rlgate serve --engine fake` must not grow without bound)
        self.requests: list[GenerateRequest] = []
        self.served = 0  # requests received, all of them
        self.aborted = 0  # streams closed before they finished
        self._version = 0
        self._adapters: dict[str, int] = {}  # LoRA adapters "loaded", by name: their versions
        self._running = asyncio.Event()  # cleared while generation is paused (weight updates)
        self._running.set()
        self._script_pos = 0
        self._filler = tokenizer.encode(_FILLER, add_special_tokens=False) if tokenizer is not None else list(range(10, 60))

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_length(self) -> int:
        return self._max_ctx

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def _next_item(self, request: GenerateRequest) -> ScriptItem | None:
        if callable(self.script):
            return self.script(request)
        if self.script is not None and self._script_pos < len(self.script):
            item = self.script[self._script_pos]
            self._script_pos += 1
            return item
        return None

    def _planned_ids(self, request: GenerateRequest) -> list[int]:
        stops = list(request.sampling.stop_token_ids)
        item = self._next_item(request)
        if item is None:
            n = max(1, self.output_tokens)
            body = [self._filler[i % len(self._filler)] for i in range(n - 1)]
            return body + stops[:1] if stops else body + [self._filler[0]]
        if isinstance(item, list):
            return list(item)
        if isinstance(item, str):
            item = Scripted(text=item)
        if item.ids is not None:
            return list(item.ids)
        if self.tokenizer is None:
            raise ValueError("text scripts need a tokenizer")
        ids = self.tokenizer.encode(item.text or "", add_special_tokens=False)
        return ids + (stops[:1] if item.add_stop and stops else [])

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        self.requests.append(request)
        self.served += 1
        if len(self.requests) > KEEP_REQUESTS:
            del self.requests[: KEEP_REQUESTS // 2]
        if self.fail_with is not None:
            raise self.fail_with
        if not request.input_ids:
            raise EngineError("empty prompt", status=400, code="invalid_request")
        if len(request.input_ids) >= self._max_ctx:
            raise EngineError("prompt exceeds the context", status=400, code="context_length_exceeded")
        adapter = request.adapter
        if adapter is not None and adapter not in self._adapters:
            raise EngineError(f"no adapter {adapter!r} is loaded", status=404, code="adapter_not_found")
        planned = self._planned_ids(request)
        limit = min(request.sampling.max_new_tokens, self._max_ctx - len(request.input_ids))
        stops = set(request.sampling.stop_token_ids)
        finished = False
        try:
            if self.prefill_delay:
                await asyncio.sleep(self.prefill_delay)
            for pos, tok in enumerate(planned):
                if pos >= limit:
                    break
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
                if not self._running.is_set():  # paused: this token waits (and gets the version after)
                    await self._running.wait()
                finish: FinishReason | None = "stop" if tok in stops else None
                if finish is None and pos + 1 >= limit:
                    finish = "length"
                if adapter is not None and adapter not in self._adapters:
                    raise EngineError(f"adapter {adapter!r} was unloaded", status=410, code="adapter_unloaded")
                version = self._version if adapter is None else self._adapters[adapter]
                yield TokenDelta([tok], [fake_logprob(tok, pos)], [version], finish)
                if finish is not None:
                    finished = True
                    return
            finished = True
            # Script ran out before a stop token or the limit: report it as a stop.
            yield TokenDelta([], [], [], "stop" if planned else "length")
        finally:
            if not finished:
                self.aborted += 1

    async def update_weights_from_path(self, path: str) -> int:
        """Check the checkpoint directory as every engine does (engine/weights_path.py: the files
        are not read), then bump the version."""
        await asyncio.to_thread(checkpoint_dir, path)
        self._version += 1
        return self._version

    async def load_adapter(self, name: str, path: str, version: int | None = None) -> int:
        """Check the adapter directory as every engine does (its files are not read); count its version."""
        await asyncio.to_thread(adapter_dir, path)
        new = version if version is not None else self._adapters[name] + 1 if name in self._adapters else 0
        self._adapters[name] = new
        return new

    async def unload_adapter(self, name: str) -> None:
        self._adapters.pop(name, None)

    def adapter_versions(self) -> dict[str, int]:
        return dict(self._adapters)

    async def pause_generation(self) -> None:
        """Requests in flight stop before their next token; they continue on ``continue_generation``."""
        self._running.clear()

    async def continue_generation(self) -> None:
        self._running.set()

    def restore_version(self, version: int) -> None:
        """Declare the weights loaded now to be ``version`` (a replica catching up after a restart)."""
        self._version = version

    async def bump_version(self) -> int:
        self._version += 1
        return self._version


class ToolRoundScript:
    """A generic agent script for :class:`FakeEngine` (``script=ToolRoundScript(tokenizer)``).

    Reads the rendered prompt and answers like a minimal tool-using agent, whatever the client:

    * the last user turn holds a tool result -> a final answer (``answer``);
    * else, tools are listed in the prompt -> one call of a listed tool (the first whose name is
      in ``prefer``, else the first listed), with arguments made from its JSON schema: every
      required string is ``text``, a list of strings ``[text]``, a number 1, a boolean false;
    * else -> the final answer.

    The markers default to the ChatML + Hermes layout of the tiny model's template (tools as JSON
    lines between ``<tools>`` tags, results in ``<tool_response>``, calls in ``<tool_call>``).
    This is test scaffolding that reads text, not an engine feature: engines see ids only.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        prefer: tuple[str, ...] = (),
        text: str = "ls",
        answer: str = "Done.",
        user_marker: str = "<|im_start|>user",
        tools_open: str = "<tools>",
        tools_close: str = "</tools>",
        result_marker: str = "<tool_response>",
    ) -> None:
        self.tokenizer = tokenizer
        self.prefer = prefer
        self.text = text
        self.answer = answer
        self.user_marker = user_marker
        self.tools_open, self.tools_close = tools_open, tools_close
        self.result_marker = result_marker
        self.calls: list[dict[str, Any]] = []  # every call it made: {"name", "arguments"}

    def _tools(self, prompt: str) -> list[dict[str, Any]]:
        """The JSON tool specs of the first ``<tools>`` block that holds any (the template's own
        instructions may mention the tags before the block)."""
        start = prompt.find(self.tools_open)
        while start >= 0:
            end = prompt.find(self.tools_close, start)
            if end < 0:
                return []
            tools = []
            for line in prompt[start + len(self.tools_open):end].splitlines():
                try:
                    spec = json.loads(line)
                except ValueError:
                    continue
                for one in spec if isinstance(spec, list) else [spec]:  # a spec a line, or a list (--tool-prompt)
                    fn = one.get("function", one) if isinstance(one, dict) else None
                    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                        tools.append(fn)
            if tools:
                return tools
            start = prompt.find(self.tools_open, end)
        return []

    def _value(self, schema: Any) -> Any:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind == "array":
            return [self.text] if (schema.get("items") or {}).get("type") == "string" else []
        return {"integer": 1, "number": 1, "boolean": False, "object": {}}.get(kind, self.text)  # type: ignore[arg-type]

    def __call__(self, request: GenerateRequest) -> ScriptItem:
        prompt = self.tokenizer.decode(request.input_ids, skip_special_tokens=False)
        last_user = prompt.rsplit(self.user_marker, 1)[-1]
        tools = self._tools(prompt)
        if self.result_marker in last_user or not tools:
            return self.answer
        named = {t["name"]: t for t in tools}
        tool = next((named[n] for n in self.prefer if n in named), tools[0])
        params = tool.get("parameters") or {}
        props = params.get("properties") or {}
        args = {k: self._value(props.get(k)) for k in params.get("required") or []}
        self.calls.append({"name": tool["name"], "arguments": args})
        return "<tool_call>\n" + json.dumps({"name": tool["name"], "arguments": args}) + "\n</tool_call>"


if TYPE_CHECKING:  # mypy checks that FakeEngine has these capabilities (engine/capabilities.py)
    from rlgate.engine.base import Engine
    from rlgate.engine.capabilities import Pausable, ServesAdapters, VersionRestorable

    def _capabilities(engine: FakeEngine) -> tuple[Engine, Pausable, VersionRestorable, ServesAdapters]:
        return engine, engine, engine, engine
