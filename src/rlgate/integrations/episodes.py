"""Episodes played through rlgate for another trainer: one agent run per item, one chain back.

Both adapters (``integrations/trl.py``, ``integrations/verl.py``) ask the same thing: play the
user's agent once per item through a gateway session (the rollout runner's episode: start, run,
reward, end, export in ``concat`` style) and hand back the one token sequence the trainer
trains on. That sequence is the episode's **last conversation chain** (the root-to-leaf chain
of its last completed interaction): prompt ids, then every token after them with a mask that
is 1 on the tokens the model generated and 0 on the tool / user tokens between turns, and the
engine's behaviour logprobs and weight versions there. The other trainers take one sequence
per item; an episode whose agent forked its conversation (edited history, a side request)
has more than one chain, and those are counted in :attr:`Chain.dropped_chains`, not sent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from rlgate.rollout.runner import Episode, RolloutRunner
from rlgate.trajectory.formats import split

T = TypeVar("T")


@dataclass
class Chain:
    """What an adapter returns for one played item."""

    ok: bool  # the episode completed and generated at least one token
    prompt_ids: list[int]  # tokens before the first generated one (empty when not ok)
    response_ids: list[int]  # generated tokens and the tool / user tokens between turns
    response_mask: list[int]  # 1 on generated tokens
    response_logprobs: list[float]  # engine's behaviour logprob per generated token, 0.0 elsewhere
    response_versions: list[int]  # weight version per generated token, -1 elsewhere
    reward: float | None  # the episode's reward (None when it failed)
    session_id: str | None
    turns: int  # LLM calls in the chain
    dropped_chains: int  # other conversations of the episode (forks), not returned
    error: str | None = None  # why it failed

    @property
    def min_version(self) -> int | None:
        vs = [v for v, m in zip(self.response_versions, self.response_mask, strict=True) if m and v >= 0]
        return min(vs) if vs else None


def chain_of(ep: Episode) -> Chain:
    """The chain an adapter returns for ``ep`` (see the module docstring)."""
    if not ep.ok:
        return _failed(ep, ep.error or "the episode failed")
    samples = [s for s in ep.samples if split(s) is not None]
    if not samples:
        return _failed(ep, "the episode generated no token")
    last = samples[-1]
    cut = split(last)
    assert cut is not None
    return Chain(True, cut.prompt_ids, cut.response_ids, cut.response_mask, cut.response_logprobs,
                 cut.response_versions, ep.reward, ep.session_id, len(last.chain or [last.id]), len(samples) - 1)


def _failed(ep: Episode, error: str) -> Chain:
    return Chain(False, [], [], [], [], [], None, ep.session_id, 0, 0, error)


async def play(runner: RolloutRunner, items: list[tuple[str, int, dict[str, Any]]]) -> list[Chain]:
    """Play ``(group_id, index, data)`` items at once (capacity granted here); one chain per item, in order."""
    await runner.client.grant_capacity(len(items))
    episodes = await asyncio.gather(*(runner.episode(gid, k, data, admit=False) for gid, k, data in items))
    return [chain_of(ep) for ep in episodes]


class LoopThread:
    """An event loop in a thread of its own, for trainers that call rollouts synchronously: the
    gateway client, the runner and the weight pushes live on it for the adapter's whole life
    (an ``httpx`` client is bound to the loop it first ran on)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rlgate-integration", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        async def wrap() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result()

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        self.loop.close()
