"""Worker-side state of the local engine: one request, the running batch, a command.

The event loop and the worker thread share these objects: the worker sends each
:class:`~rlgate.engine.base.TokenDelta` to its consumer's loop with
``loop.call_soon_threadsafe``; the consumer only ever sets ``RequestState.aborted``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlgate.engine.base import SamplingParams, TokenDelta
from rlgate.engine.local.cache import PaddedCache, left_pad_2d

__all__ = ["Batch", "Command", "RequestState", "coalesce"]


@dataclass(eq=False)
class RequestState:
    """Worker-side state of one generation."""

    input_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenDelta | BaseException]
    stop_ids: frozenset[int] = frozenset()
    session_id: str | None = None  # whose request (admission is fair across sessions)
    adapter: str | None = None  # the LoRA adapter its tokens are generated with (None: the base weights)
    generated: list[int] = field(default_factory=list)  # tokens sampled so far (worker thread)
    finished: bool = False  # set by the worker once the final delta is sent
    aborted: bool = False  # set by the consumer (stream closed early)
    queued_at: float = field(default_factory=time.perf_counter)  # when it joined the queue (metrics)

    @property
    def num_generated(self) -> int:
        return len(self.generated)

    @property
    def sequence(self) -> list[int]:
        """Prompt + generated tokens: what a (re-)prefill feeds the model."""
        return self.input_ids + self.generated

    @property
    def done(self) -> bool:
        return self.finished or self.aborted

    def push(self, item: TokenDelta | BaseException) -> None:
        """Hand an item to the consumer's event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            self.aborted = True

    def finish_with(self, item: TokenDelta | BaseException) -> None:
        if not self.done:
            self.finished = True
            self.push(item)


@dataclass(eq=False)
class Batch:
    """The running rows and their shared left-padded cache (worker thread only)."""

    rows: list[RequestState]
    cache: PaddedCache
    mask: torch.Tensor  # [B, S] 1 = real token in the cache, 0 = padding
    positions: torch.Tensor  # [B] position id of each row's next input token
    next_tokens: list[int]  # sampled last step, not yet fed to the model

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` and trim columns that are now padding everywhere."""
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.next_tokens = [self.next_tokens[i] for i in keep]
        self.cache.select_rows(idx)
        self.mask = self.mask.index_select(0, idx)
        self.positions = self.positions.index_select(0, idx)
        used = self.mask.any(dim=0)
        first = int(used.to(torch.int8).argmax()) if bool(used.any()) else self.mask.shape[1]
        if first:
            self.cache.trim_left(first)
            self.mask = self.mask[:, first:]

    def extend(self, other: Batch) -> None:
        """Merge ``other`` (freshly prefilled rows) into this batch."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        self.cache = PaddedCache.concat(self.cache, other.cache)
        self.mask = torch.cat([left_pad_2d(self.mask, length), left_pad_2d(other.mask, length)])
        self.positions = torch.cat([self.positions, other.positions])
        self.rows = self.rows + other.rows  # a new list: other threads may be reading the old one
        self.next_tokens = self.next_tokens + other.next_tokens


@dataclass(eq=False)
class Command:
    """Work run on the worker thread between decoding steps (weight swaps)."""

    fn: Callable[[], int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int] = field(repr=False)

    def resolve(self, result: int) -> None:
        """Hand the command's result to the waiting coroutine (from the worker thread)."""
        self._call_soon(lambda: self.future.set_result(result))

    def fail(self, error: BaseException) -> None:
        """Raise ``error`` in the waiting coroutine (from the worker thread)."""
        self._call_soon(lambda: self.future.set_exception(error))

    def _call_soon(self, settle: Callable[[], None]) -> None:
        def run() -> None:
            if not self.future.done():
                settle()

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError:  # the waiting loop is closed: nobody is listening
            pass


def coalesce(
    first: TokenDelta | BaseException, queue: asyncio.Queue[TokenDelta | BaseException]
) -> TokenDelta:
    """Merge ``first`` with every delta already waiting in ``queue``."""
    if isinstance(first, BaseException):
        raise first
    ids, lps, vers = list(first.token_ids), list(first.logprobs), list(first.versions)
    finish = first.finish_reason
    while finish is None and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, BaseException):
            raise item
        ids += item.token_ids
        lps += item.logprobs
        vers += item.versions
        finish = item.finish_reason
    return TokenDelta(ids, lps, vers, finish)
