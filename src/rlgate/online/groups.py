"""Live GRPO groups: k-1 extra replies to a user's prompt, off the user's path, scored as one group.

For a fraction ``group_fraction`` of completed replies, :class:`LiveGroups` samples ``group_size - 1``
more replies to exactly the same prompt token ids with the same sampling parameters (each with
its own seed), on the same version (the engine routes them by the user's session), scores the
``k`` replies -- the user's and the extras -- with one reward function or judge, and hands the
trainer a :class:`LiveGroup`: k samples of one prompt with rewards, a proper GRPO group.

* **Never shown, never in the way.** The extras start after the user's reply is complete (the
  completion hook runs when the last token is recorded), are never recorded in the user's session
  and never returned to anyone; they run as ordinary engine requests, so they share batches with
  user traffic rather than delaying it.
* **Bounded cost.** A token bucket of ``group_tokens_per_minute`` extra tokens: a group is taken
  only when its worst case (``(k - 1) * max_new_tokens``) fits, and what it did not use is given
  back. **Shed first under load:** while the engine has more than ``group_shed_waiting``
  requests waiting for a batch row, no group starts. Every outcome is counted
  (:attr:`LiveGroups.counts`, ``rlgate_online_groups_total{outcome}`` in /metrics).
* **Scoring.** ``group_reward`` names (operator configuration, loaded once at startup) a reward
  in rlgate's one protocol (``trajectory/reward.py``), the same as ``rlgate train``'s ``reward:``:
  an object with ``score_group(episodes) -> list[float]`` (a judge scoring the replies side by side,
  e.g. ``mypkg.rewards:judge`` holding ``Judge("http://judge:9000/v1", rubric=...)`` from
  ``rlgate.rewards.judge``) or a function ``(episode) -> float`` applied to each reply (either may be
  async). Each reply is a :class:`~rlgate.trajectory.reward.FinishedEpisode` whose one sample is the
  reply, ``final_text`` its text and ``data`` ``{"messages": the prompt's messages}``. Scores are clipped to
  ``[reward_low, reward_high]`` (counted); a group with a non-finite score is dropped (outcome
  ``nonfinite_reward``, logged), so a broken judge cannot poison the trainer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlgate.config import OnlineConfig
from rlgate.engine.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from rlgate.object_spec import load_object
from rlgate.trajectory.export import individual_sample
from rlgate.trajectory.interaction import Interaction
from rlgate.trajectory.reward import FinishedEpisode, GroupReward, score_group
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.online.groups")

OUTCOMES = ("started", "completed", "skipped_budget", "shed_load", "failed", "nonfinite_reward")


class GroupScorer(Protocol):
    async def __call__(self, samples: list[Sample]) -> list[float]:
        """One reward per reply, in order."""
        ...


def load_scorer(path: str) -> GroupScorer:
    """The ``group_reward`` named by the operator's configuration (``package.module:attribute``)."""
    obj = load_object(path, "group_reward")
    if inspect.isclass(obj):
        obj = obj()
    return scorer_of(obj)


def scorer_of(reward: Any) -> GroupScorer:
    """The live groups' scorer for a reward of either form (``trajectory/reward.py``): the replies as
    episodes, the group form when the reward has it, else the episode form on each reply."""
    if not isinstance(reward, GroupReward) and not callable(reward):
        raise TypeError(f"{reward!r} is neither a reward function (episode) -> float nor has score_group")

    async def score(samples: list[Sample]) -> list[float]:
        episodes = [FinishedEpisode({"messages": s.messages}, s.output_text, s.session_id, [s]) for s in samples]
        out = await score_group(reward, episodes)
        return [float(r[s.id]) if isinstance(r, dict) else float(r) for r, s in zip(out, samples, strict=True)]
    return score


@dataclass
class TokenBudget:
    """A token bucket: ``per_minute`` tokens refill evenly; at most one minute's worth is banked."""

    per_minute: int
    clock: Callable[[], float] = time.monotonic
    tokens: float = -1.0  # starts full
    at: float = 0.0

    def _refill(self) -> None:
        now = self.clock()
        if self.tokens < 0:
            self.tokens, self.at = float(self.per_minute), now
            return
        self.tokens = min(float(self.per_minute), self.tokens + (now - self.at) * self.per_minute / 60.0)
        self.at = now

    def take(self, n: int) -> bool:
        self._refill()
        if n > self.tokens:
            return False
        self.tokens -= n
        return True

    def give_back(self, n: int) -> None:
        self._refill()
        self.tokens = min(float(self.per_minute), self.tokens + n)


@dataclass
class LiveGroup:
    """k replies to one prompt with their rewards: the user's reply first, then the extras."""

    group_id: str
    conversation: str  # the user's conversation (deletion drops the group)
    tenant: str | None
    samples: list[Sample]  # rewards set; sample.group_id = group_id
    created_at: float = field(default_factory=time.time)


class LiveGroups:
    """Samples, scores and hands over live groups (see the module docstring)."""

    def __init__(self, options: OnlineConfig, engine: Engine, scorer: GroupScorer,
                 sink: Callable[[LiveGroup], None], *, decode: Callable[[list[int]], str],
                 waiting: Callable[[], int] | None = None, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``decode``: reply token ids -> text (for the scorer); ``waiting``: requests waiting for an
        engine batch row now (None: never shed)."""
        self.options = options
        self.engine = engine
        self.scorer = scorer
        self.sink = sink
        self.decode = decode
        self.waiting = waiting
        self.rng = rng or random.Random()
        self.budget = TokenBudget(options.group_tokens_per_minute, clock)
        self.counts: Counter[str] = Counter({k: 0 for k in OUTCOMES})
        self.extra_tokens = 0  # generated for live groups, all time
        self.clipped_rewards = 0  # scores outside [reward_low, reward_high], clipped into it
        self._tasks: set[asyncio.Task[None]] = set()

    def offer(self, interaction: Interaction, sampling: SamplingParams, conversation: str,
              tenant: str | None = None) -> bool:
        """A user's reply is complete: maybe start a live group on its prompt. Never blocks."""
        o = self.options
        if o.group_fraction <= 0 or interaction.finish_reason not in ("stop", "length", "tool_calls"):
            return False
        if self.rng.random() >= o.group_fraction:
            return False
        if self.waiting is not None and self.waiting() > o.group_shed_waiting:
            self.counts["shed_load"] += 1
            return False
        worst = (o.group_size - 1) * sampling.max_new_tokens
        if not self.budget.take(worst):
            self.counts["skipped_budget"] += 1
            return False
        self.counts["started"] += 1
        task = asyncio.get_running_loop().create_task(self._run(interaction, sampling, conversation, tenant, worst))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def _run(self, inter: Interaction, sampling: SamplingParams, conversation: str, tenant: str | None,
                   reserved: int) -> None:
        used = 0
        try:
            requests = [GenerateRequest(list(inter.prompt_ids),
                                        dataclasses.replace(sampling, seed=self.rng.getrandbits(63)),
                                        request_id=f"{inter.id}-group{j}", session_id=inter.session_id)
                        for j in range(1, self.options.group_size)]
            results: list[GenerateResult] = await asyncio.gather(*(self.engine.generate(r) for r in requests))
            used = sum(len(r.output_ids) for r in results)
            self.extra_tokens += used
            group_id = f"live-{inter.id}"
            samples = [individual_sample(inter, None, task_id=group_id)]
            for j, r in enumerate(results, start=1):
                samples.append(self._extra(inter, r, j))
            rewards = await self.scorer(samples)
            if len(rewards) != len(samples):
                raise ValueError(f"group_reward gave {len(rewards)} rewards for {len(samples)} replies")
            if not all(math.isfinite(r) for r in rewards):  # a broken judge must not poison the trainer
                self.counts["nonfinite_reward"] += 1
                log.error("live group on %s: group_reward gave non-finite rewards %s: dropped", inter.id, rewards)
                return
            low, high = self.options.reward_low, self.options.reward_high
            clipped = [min(max(float(r), low), high) for r in rewards]
            self.clipped_rewards += sum(1 for r, c in zip(rewards, clipped, strict=True) if r != c)
            for j, (s, reward) in enumerate(zip(samples, clipped, strict=True)):
                s.reward, s.group_id, s.episode = reward, group_id, j
            self.sink(LiveGroup(group_id, conversation, tenant, samples))
            self.counts["completed"] += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a failed side group costs the user nothing: count and log it
            self.counts["failed"] += 1
            log.exception("live group on %s failed", inter.id)
        finally:
            self.budget.give_back(max(reserved - used, 0))

    def _extra(self, inter: Interaction, r: GenerateResult, j: int) -> Sample:
        n_prompt = len(inter.prompt_ids)
        base = individual_sample(inter, None)
        return dataclasses.replace(
            base, id=f"{inter.id}-group{j}", input_ids=list(inter.prompt_ids) + r.output_ids,
            loss_mask=[0] * n_prompt + [1] * len(r.output_ids),
            logprobs=[0.0] * n_prompt + list(r.output_logprobs),
            versions=[-1] * n_prompt + list(r.output_versions),
            finish_reason=r.finish_reason, flags=[],
            output_message={"role": "assistant", "content": self.decode(r.output_ids)})

    def snapshot(self) -> Mapping[str, Any]:
        return {**self.counts, "in_flight": self.in_flight, "extra_tokens": self.extra_tokens,
                "clipped_rewards": self.clipped_rewards,
                "budget_tokens": round(max(self.budget.tokens, 0.0))}

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["GroupScorer", "LiveGroup", "LiveGroups", "TokenBudget", "load_scorer", "scorer_of"]