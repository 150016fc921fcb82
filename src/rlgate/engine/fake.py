"""A scripted, deterministic engine for tests and for measuring gateway overhead.

Outputs come from a *script*: a list consumed one item per request (or a callable
``request -> item``). An item is

* ``str``: text, encoded with the tokenizer, followed by the first stop token;
* ``list[int]``: token ids used verbatim (add the stop token yourself if wanted);
* :class:`Scripted`: ids or text with an explicit finish.

With no script (or once it is used up) every request gets ``output_tokens`` tokens
ending in the stop token. Logprobs are a deterministic function of token and
position, always finite and ≤ 0. Every request received is kept in ``requests``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from rlgate.engine.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    StreamingEngineMixin,
    TokenDelta,
    WeightUpdateError,
)
from rlgate.engine.options import EngineOptions

_FILLER = " the quick brown fox jumps over the lazy dog and runs away"


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
        fail_with: EngineError | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.output_tokens = output_tokens
        self._max_ctx = max_context_length
        self.token_delay = token_delay  # seconds between streamed tokens (0: instant)
        self.fail_with = fail_with  # raise this from every request (error-path tests)
        self.requests: list[GenerateRequest] = []
        self.aborted = 0  # streams closed before they finished
        self._version = 0
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
        if self.fail_with is not None:
            raise self.fail_with
        if not request.input_ids:
            raise EngineError("empty prompt", status=400, code="invalid_request")
        if len(request.input_ids) >= self._max_ctx:
            raise EngineError("prompt exceeds the context", status=400, code="context_length_exceeded")
        planned = self._planned_ids(request)
        limit = min(request.sampling.max_new_tokens, self._max_ctx - len(request.input_ids))
        stops = set(request.sampling.stop_token_ids)
        finished = False
        try:
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
                yield TokenDelta([tok], [fake_logprob(tok, pos)], [self._version], finish)
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
        if not os.path.isdir(path):
            raise WeightUpdateError(f"no checkpoint directory at {path!r}")
        self._version += 1
        return self._version

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
