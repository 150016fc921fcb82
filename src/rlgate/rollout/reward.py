"""Reward functions: score a finished episode outside the agent.

With ``reward: module:fn`` (``rlgate train``) or ``RolloutRunner(reward_fn=...)``, the
agent's ``run`` may return anything (a production agent returns its answer, not a
reward). After the episode the runner calls ``fn(episode)`` with a
:class:`FinishedEpisode`; it returns a float (rewards the last interaction) or
``{interaction_id: reward}``, may be ``async``, and must return finite numbers::

    def exact_answer(episode: FinishedEpisode) -> float:
        return float(episode.final_text.strip() == episode.data["answer"])
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rlgate.trajectory.sample import Sample

RewardFn = Callable[["FinishedEpisode"], "float | dict[str, float] | Awaitable[float | dict[str, float]]"]


@dataclass
class FinishedEpisode:
    """What a reward function sees."""

    data: dict[str, Any]  # the dataset item the agent was given
    output: Any  # what the agent's run() returned
    session_id: str
    samples: list[Sample] = field(default_factory=list)  # its recorded LLM calls, in order (rewards not set yet)

    @property
    def final_text(self) -> str:
        """Text of the last recorded reply ("" when there is none)."""
        return self.samples[-1].output_text if self.samples else ""

    @property
    def interaction_ids(self) -> list[str]:
        return [s.id for s in self.samples]


async def call_reward_fn(fn: RewardFn, episode: FinishedEpisode) -> Any:
    out = fn(episode)
    if inspect.isawaitable(out):
        out = await out
    return out
