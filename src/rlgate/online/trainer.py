"""The continuous trainer: train on live trajectories as their rewards arrive.

Rewarded samples come from two places: live groups (``online/groups.py``: k replies to one prompt,
scored together) and feedback on users' own turns (the RewardMap's reward of a turn's events,
``online/feedback_source.py``). :class:`OnlineTrainer` keeps them in a bounded queue and, once
``train_batch`` fresh samples wait, takes one GRPO step with the existing trainer
(``train/grpo.py: GRPOTrainer.step``, reached through the :class:`Stepper` protocol so this module
stays free of torch) and offers the new weights as the next canary candidate.

* **Groups.** A live group keeps its own group id (advantage = reward - the group's mean). Feedback
  samples that share their prompt in a step form a group the same way; the others share one
  baseline, the mean reward of the step's remaining feedback samples (REINFORCE with a batch
  baseline), since a group of one has no advantage.
* **Staleness.** A sample is dropped (and counted) when its oldest generated token is more than
  ``max_staleness_versions`` versions behind the trainer's weights, or was generated more than
  ``max_staleness_hours`` ago; a step takes at most ``train_batch_max`` fresh samples, oldest first.
  Samples within the bounds are importance-corrected by the trainer
  from their recorded per-token logprobs and versions (decoupled PPO: the ratio to the proximal
  policy, weighted by ``min(pi_prox / pi_behav, importance_cap)``). After a step whose weights
  were not yet published, every sample counts as off-policy (its proximal logprobs recomputed).
* **Replay and retention.** Trained units go to a replay buffer (``replay_capacity`` at most, each
  for ``retention_hours``); a step adds ``replay_fraction`` of its size drawn from it, still within
  the staleness bounds.
* **Deletion.** :meth:`forget` (the data-rights notifier calls it) drops a conversation's or a
  tenant's samples from the queue and the replay buffer, so nothing deleted is trained afterwards;
  samples of the step running at that moment are marked, and leave with it instead of entering the
  replay buffer.
* **Fair share.** While other tenants' samples wait, one tenant's samples make at most
  ``tenant_train_share`` of a step's fresh samples; when the queue overflows, the tenant holding the
  most pending samples loses its oldest first.
* **Poison.** A sample whose reward or recorded logprobs are not finite is dropped on arrival
  (counted). A step the stepper stops for a non-finite loss, gradient or weight
  (:class:`NonFiniteStep`) is discarded whole: its samples are dropped (not replayed), nothing is
  published, the alarm is raised (``alarm``: the gateway's ``nonfinite_steps`` guard and an ERROR
  line), and the next step starts from weights the stepper kept finite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rlgate.config import OnlineConfig
from rlgate.online.groups import LiveGroup
from rlgate.supervised import forever
from rlgate.trajectory.batch import StepBatch, lag
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.online.trainer")

COUNTS = ("received_group_samples", "received_feedback_samples", "dropped_stale_versions", "dropped_stale_hours",
          "dropped_overflow", "dropped_deleted", "dropped_nonfinite", "trained_samples", "replayed_samples", "steps",
          "nonfinite_steps", "published")


class NonFiniteStep(Exception):  # noqa: N818 - it names what happened, as StopIteration does
    """The stepper stopped a step: its loss, a gradient or the weights were not finite. ``reverted``: the
    weights were set back to the last published version's (the unpublished steps are lost)."""

    def __init__(self, what: str, *, reverted: bool = False) -> None:
        super().__init__(what)
        self.what = what
        self.reverted = reverted


def finite_sample(sample: Sample) -> bool:
    """A sample a step can take: a finite reward and finite recorded logprobs on its generated tokens."""
    if sample.reward is None or not math.isfinite(sample.reward):
        return False
    return all(math.isfinite(lp) for lp, m in zip(sample.logprobs, sample.loss_mask, strict=False) if m)


class Stepper(Protocol):
    """What takes one optimisation step: ``GRPOTrainer.step`` has exactly this signature."""

    def step(self, samples: list[Sample], group_ids: list[str], current_version: int) -> dict[str, float]:
        ...


@dataclass
class Unit:
    """What is queued, trained and replayed together: one live group, or one rewarded turn."""

    samples: list[Sample]  # rewards set
    kind: Literal["group", "feedback"]
    conversation: str
    tenant: str | None
    generated_at: float  # unix time the replies were generated
    group_id: str = ""  # live groups: their id


class OnlineTrainer:
    """Queue, staleness, replay, deletion and the step loop (see the module docstring)."""

    def __init__(self, options: OnlineConfig, stepper: Stepper, publish: Callable[[], Awaitable[int | None]], *,
                 version: int = 0, clock: Callable[[], float] = time.time, rng: random.Random | None = None) -> None:
        """``publish()``: offer the trainer's weights as the next candidate; its version, or None when none
        can start now (a canary is still running): training goes on and the next step offers again."""
        self.options = options
        self.stepper = stepper
        self.publish = publish
        self.version = version  # of the weights last published (or served when training started)
        self.dirty = False  # the trainer's weights moved since they were published
        self.unpublished_steps = 0  # steps since then (a candidate every candidate_steps)
        self.publishing = True  # False: steps go on, no candidate is offered (an operator's hold)
        self.clock = clock
        self.rng = rng or random.Random()
        self.pending: deque[Unit] = deque()
        self.replay: deque[Unit] = deque()
        self.counts: Counter[str] = Counter({k: 0 for k in COUNTS})
        self.last_step: dict[str, float] = {}  # metrics of the last step (staleness included)
        self._epoch = 0  # bumped by reset(): a step that ran across a revert leaves nothing to publish
        self._running: list[Unit] = []  # the fresh units of the step in flight
        self._doomed: set[int] = set()  # ids of running units deleted meanwhile (they leave with the step)
        self.alarm: Callable[[str, int, int], None] | None = None  # (guard, failures, events): the gateway's guards
        self._wake = asyncio.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlgate-online-train")

    # ------------------------------------------------------------------ input

    @property
    def pending_samples(self) -> int:
        return sum(len(u.samples) for u in self.pending)

    def add_group(self, group: LiveGroup) -> None:
        self.counts["received_group_samples"] += len(group.samples)
        self._add(Unit(group.samples, "group", group.conversation, group.tenant, group.created_at, group.group_id))

    def add_feedback(self, sample: Sample, conversation: str, tenant: str | None, generated_at: float) -> None:
        if sample.reward is None:
            raise ValueError(f"sample {sample.id} has no reward")
        self.counts["received_feedback_samples"] += 1
        self._add(Unit([sample], "feedback", conversation, tenant, generated_at))

    def _add(self, unit: Unit) -> None:
        if not all(finite_sample(s) for s in unit.samples):
            self.counts["dropped_nonfinite"] += len(unit.samples)
            log.error("online trainer: a %s sample of conversation %s has a non-finite reward or logprob: dropped",
                      unit.kind, unit.conversation)
            return
        self.pending.append(unit)
        while self.pending_samples > self.options.pending_limit:
            self._drop_overflow()
        self._wake.set()

    def _drop_overflow(self) -> None:
        """The queue is full: the oldest unit of the tenant holding the most pending samples goes."""
        held: Counter[str | None] = Counter()
        for u in self.pending:
            held[u.tenant] += len(u.samples)
        heaviest = max(held, key=lambda t: held[t])
        for i, u in enumerate(self.pending):
            if u.tenant == heaviest:
                del self.pending[i]
                self.counts["dropped_overflow"] += len(u.samples)
                return

    def forget_turns(self, turn_ids: set[str] | frozenset[str]) -> int:
        """Drop every queued or replayable unit that holds one of these (deleted) turns: a rewarded turn, or
        a live group on one (its first sample is the user's reply); how many samples."""
        def doomed(u: Unit) -> bool:
            return bool(u.samples) and (u.samples[0].id in turn_ids or any(s.id in turn_ids for s in u.samples))

        return self._drop(doomed)

    def forget(self, *, conversation: str | None = None, tenant: str | None = None) -> int:
        """Drop every queued or replayable sample of a deleted conversation (of ``tenant`` when given:
        conversation ids are a tenant's own namespace) or of a whole tenant; how many."""
        if conversation is None and tenant is None:
            raise ValueError("forget what? name a conversation or a tenant")

        def doomed(u: Unit) -> bool:
            return (conversation is None or u.conversation == conversation) and (tenant is None or u.tenant == tenant)

        return self._drop(doomed)

    def _drop(self, doomed: Callable[[Unit], bool]) -> int:
        dropped = 0
        for q in (self.pending, self.replay):
            keep = [u for u in q if not doomed(u)]
            dropped += sum(len(u.samples) for u in q) - sum(len(u.samples) for u in keep)
            q.clear()
            q.extend(keep)
        for u in self._running:  # in the step now: it leaves with the step, never replayed
            if id(u) not in self._doomed and doomed(u):
                self._doomed.add(id(u))
                dropped += len(u.samples)
        self.counts["dropped_deleted"] += dropped
        return dropped

    # ------------------------------------------------------------------ batches

    @property
    def current_version(self) -> int:
        """The version the trainer's weights count as: a step not yet published makes every sample stale."""
        return self.version + 1 if self.dirty else self.version

    def _lag(self, u: Unit) -> int:
        return lag(u.samples, self.current_version)

    def _fresh(self, u: Unit, now: float, *, count: bool) -> bool:
        if self._lag(u) > self.options.max_staleness_versions:
            if count:
                self.counts["dropped_stale_versions"] += len(u.samples)
            return False
        if now - u.generated_at > self.options.max_staleness_hours * 3600:
            if count:
                self.counts["dropped_stale_hours"] += len(u.samples)
            return False
        return True

    def take_batch(self) -> tuple[list[Unit], list[Unit]] | None:
        """The next step's units (fresh, replayed), or None while fewer than ``train_batch`` fresh samples wait;
        at most ``train_batch_max`` fresh samples, the oldest first."""
        now = self.clock()
        kept = [u for u in self.pending if self._fresh(u, now, count=True)]
        self.pending.clear()
        self.pending.extend(kept)
        if self.pending_samples < self.options.train_batch:
            return None
        fresh = self._fair_take()
        horizon = now - self.options.retention_hours * 3600
        alive = [u for u in self.replay if u.generated_at >= horizon]
        self.replay.clear()
        self.replay.extend(alive)
        want = int(self.options.replay_fraction * sum(len(u.samples) for u in fresh))
        candidates = [u for u in self.replay if self._fresh(u, now, count=False)]
        self.rng.shuffle(candidates)
        replayed: list[Unit] = []
        for u in candidates:
            if want <= 0:
                break
            replayed.append(u)
            want -= len(u.samples)
        return fresh, replayed

    def _fair_take(self) -> list[Unit]:
        """A step's fresh units, oldest first, at most ``train_batch_max`` samples; while other tenants' samples
        wait, one tenant's take at most ``tenant_train_share`` of the step (the rest wait their turn)."""
        o = self.options
        cap = max(1, math.ceil(o.tenant_train_share * o.train_batch_max))
        waiting: Counter[str | None] = Counter(u.tenant for u in self.pending)
        by_tenant: Counter[str | None] = Counter()
        fresh: list[Unit] = []
        kept: list[Unit] = []
        taken = 0
        for unit in self.pending:
            n = len(unit.samples)
            room = not fresh or taken + n <= o.train_batch_max
            others = any(k > 0 for t, k in waiting.items() if t != unit.tenant)
            fair = not others or by_tenant[unit.tenant] == 0 or by_tenant[unit.tenant] + n <= cap
            if room and fair:
                fresh.append(unit)
                taken += n
                by_tenant[unit.tenant] += n
            else:
                kept.append(unit)
            waiting[unit.tenant] -= 1
        self.pending.clear()
        self.pending.extend(kept)
        return fresh

    def batch_of(self, units: list[Unit]) -> StepBatch:
        """The step's batch (trajectory/batch.py): samples, their GRPO group ids (see the module docstring:
        groups, prompt groups, batch baseline), each unit's lag and age."""
        now = self.clock()
        batch = StepBatch()

        def add(u: Unit, samples: list[Sample], group_id: str) -> None:
            batch.add(samples, group_id, lag=self._lag(u), age_hours=(now - u.generated_at) / 3600)

        by_prompt: dict[tuple[int, ...], list[tuple[Unit, Sample]]] = {}
        for u in units:
            if u.kind == "group":
                add(u, u.samples, u.group_id)
                continue
            for s in u.samples:
                prompt = tuple(t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if not m)
                by_prompt.setdefault(prompt, []).append((u, s))
        rest: list[tuple[Unit, Sample]] = []
        for k, (_, group) in enumerate(by_prompt.items()):
            if len(group) > 1:
                for u, s in group:
                    add(u, [s], f"feedback-prompt-{k}")
            else:
                rest += group
        if len(rest) > 1:
            for u, s in rest:
                add(u, [s], "feedback-batch")
        return batch

    # ------------------------------------------------------------------ the loop

    async def step_once(self) -> dict[str, float] | None:
        """Take one step if a batch is ready; then offer the weights as a candidate."""
        batch = self.take_batch()
        if batch is None:
            return None
        fresh, replayed = batch
        step = self.batch_of(fresh + replayed)
        samples, gids = step.samples, step.group_ids
        version = self.current_version
        metrics: dict[str, float] = {}
        self._running, self._doomed = fresh, set()  # (replayed units stay in the replay buffer meanwhile)
        try:
            if samples:
                loop = asyncio.get_running_loop()
                epoch = self._epoch
                try:
                    metrics = await loop.run_in_executor(self._pool, self.stepper.step, samples, gids, version)
                except NonFiniteStep as exc:
                    self._discard(exc, fresh, replayed)
                    return {"nonfinite": 1.0}
                if epoch == self._epoch:
                    self.dirty = True
                    self.unpublished_steps += 1
            self.counts["steps"] += 1
            self.counts["trained_samples"] += sum(len(u.samples) for u in fresh)
            self.counts["replayed_samples"] += sum(len(u.samples) for u in replayed)
            if self.alarm is not None:
                self.alarm("nonfinite_steps", 0, 1)
            for u in fresh:
                if id(u) not in self._doomed:  # deleted while the step ran: never replayed
                    self.replay.append(u)
        finally:
            self._running, self._doomed = [], set()
        while sum(len(u.samples) for u in self.replay) > self.options.replay_capacity:
            self.replay.popleft()
        # a step of lone feedback turns trains on nothing: its staleness reads 0
        metrics.update({"staleness_hours_mean": 0.0, "staleness_hours_max": 0.0, **step.metrics(),
                        "trained_version": float(version)})
        self.last_step = metrics
        await self.try_publish()
        return metrics

    def _discard(self, exc: NonFiniteStep, fresh: list[Unit], replayed: list[Unit]) -> None:
        """A step stopped for a non-finite value: drop its samples, count and alarm; after a revert the
        trainer's weights are the last published version's again."""
        n = sum(len(u.samples) for u in fresh)
        self.counts["nonfinite_steps"] += 1
        self.counts["dropped_nonfinite"] += n
        ids = {id(u) for u in replayed}
        self.replay = deque(u for u in self.replay if id(u) not in ids)  # they were in this step too
        if exc.reverted:
            self.dirty, self.unpublished_steps = False, 0
        if self.alarm is not None:
            self.alarm("nonfinite_steps", 1, 1)
        log.error("online trainer: step stopped (%s): its %d fresh and %d replayed samples are dropped, nothing "
                  "is published%s", exc.what, n, sum(len(u.samples) for u in replayed),
                  "; the weights are set back to the last published version" if exc.reverted else
                  "; the weights are as before the step")

    async def try_publish(self) -> int | None:
        if not self.dirty or not self.publishing or self.unpublished_steps < self.options.candidate_steps:
            return None
        v = await self.publish()
        if v is not None:
            self.version, self.dirty, self.unpublished_steps = v, False, 0
            self.counts["published"] += 1
            log.info("online trainer: weights published as version %d", v)
        return v

    def reset(self, version: int) -> None:
        """The trainer's weights are set back to ``version`` (a rolled-back canary) before its next step."""
        self.version, self.dirty, self.unpublished_steps = version, False, 0
        self._epoch += 1

    async def run(self) -> None:
        """Step whenever a batch is ready, until cancelled; a failed step is logged with its traceback
        and serving goes on."""
        async def woken() -> None:
            await self._wake.wait()
            self._wake.clear()

        async def steps() -> None:
            while await self.step_once() is not None:
                pass
            await self.try_publish()  # a canary may have ended since the last step

        await forever(steps, wait=woken, what="online training step", log=log)

    def poke(self) -> None:
        """Look again (a canary decision may allow a publish)."""
        self._wake.set()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def snapshot(self) -> Mapping[str, Any]:
        return {**self.counts, "pending_samples": self.pending_samples,
                "replay_samples": sum(len(u.samples) for u in self.replay), "version": self.version,
                "unpublished_steps": self.unpublished_steps, "last_step": dict(self.last_step)}
