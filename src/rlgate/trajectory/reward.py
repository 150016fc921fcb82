"""The one reward protocol: what a reward sees (:class:`FinishedEpisode`) and its two forms.

A reward is written once and works wherever rlgate scores replies: ``rlgate train`` and
``RolloutRunner(reward_fn=...)`` (``reward: module:attr``), the online mode's live groups
(``--group-reward``) and the LLM judge (``rlgate.rewards.judge.Judge``, which has both forms).

* **Episode form**: ``fn(episode) -> float | {interaction_id: float}`` (or an awaitable of one),
  called with a :class:`FinishedEpisode`::

      def exact_answer(episode: FinishedEpisode) -> float:
          return float(episode.final_text.strip() == episode.data["answer"])

* **Group form**: an object with ``score_group(episodes) -> list[float]`` (or an awaitable of one),
  one reward per episode, in order: a GRPO group scored side by side, relative to each other.

Where episodes come in groups (a training run's GRPO groups, a live group's k replies) the group form
is used when the reward has it, else the episode form per episode (:func:`score_group`); where they
come one at a time (evaluation, ``rlgate check``) the episode form is used when the reward has it,
else the group form on a group of one (:func:`score_episode`). A live group's reply is an episode
whose ``data`` is ``{"messages": the prompt's messages}`` (live traffic has no dataset item) and
whose one sample is the reply.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlgate.trajectory.sample import Sample

__all__ = ["FinishedEpisode", "GroupReward", "RewardFn", "score_episode", "score_group"]

RewardFn = Callable[["FinishedEpisode"], "float | dict[str, float] | Awaitable[float | dict[str, float]]"]


@dataclass
class FinishedEpisode:
    """What a reward sees."""

    data: dict[str, Any]  # the dataset item the agent was given (a live reply: {"messages": the prompt})
    output: Any  # what the agent's run() returned (a live reply: its text)
    session_id: str
    samples: list[Sample] = field(default_factory=list)  # its recorded LLM calls, in order (rewards not set yet)

    @property
    def final_text(self) -> str:
        """Text of the last recorded reply ("" when there is none)."""
        return self.samples[-1].output_text if self.samples else ""

    @property
    def interaction_ids(self) -> list[str]:
        return [s.id for s in self.samples]


@runtime_checkable
class GroupReward(Protocol):
    """The group form: one reward per episode of a group, in order."""

    def score_group(self, episodes: list[FinishedEpisode]) -> list[float] | Awaitable[list[float]]:
        ...


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def score_group(reward: Any, episodes: list[FinishedEpisode]) -> list[Any]:
    """The rewards of a group's episodes (each a float or ``{interaction_id: float}``): the group form
    when ``reward`` has it, else the episode form on each episode. ValueError when the group form
    answers with another count than the episodes'."""
    if isinstance(reward, GroupReward):
        out = list(await _resolved(reward.score_group(episodes)))
        if len(out) != len(episodes):
            raise ValueError(f"score_group gave {len(out)} rewards for {len(episodes)} episodes")
        return out
    if not callable(reward):
        raise TypeError(f"{reward!r} is neither a reward function (episode) -> float nor has score_group")
    return [await _resolved(reward(e)) for e in episodes]


async def score_episode(reward: Any, episode: FinishedEpisode) -> Any:
    """One episode's reward: the episode form when ``reward`` is callable, else the group form on a group
    of one."""
    if callable(reward):
        return await _resolved(reward(episode))
    return (await score_group(reward, [episode]))[0]
