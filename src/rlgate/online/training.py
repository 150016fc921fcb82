"""Online training bound to one gateway: live groups, feedback, the trainer and the canary together.

:class:`OnlineTraining` is what ``create_app(..., online_training=...)`` receives. The gateway calls
:meth:`on_completed` when a user's reply is recorded (live groups start there, off the user's path),
:meth:`on_deletion` from the data-rights notifier (``online/rights.py``), and runs :meth:`run` for
its lifetime: the trainer's step loop and the feedback tail. The admin routes
(``api/canary_routes.py``) and ``/metrics`` (:meth:`collect`) read and act on the canary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rlgate.engine.base import SamplingParams
from rlgate.online.canary import Canary
from rlgate.online.feedback_source import FeedbackTail
from rlgate.online.groups import OUTCOMES, LiveGroup, LiveGroups
from rlgate.online.options import OnlineOptions
from rlgate.online.redaction import Redactor
from rlgate.online.rights import Deletion
from rlgate.online.trainer import OnlineTrainer
from rlgate.online.versions import TwoSlotEngine
from rlgate.trajectory.interaction import Interaction
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.online.training")


def redacted(hook: Redactor, sample: Sample) -> Sample | None:
    """``sample`` through the redaction hook (None: withheld)."""
    out = hook(sample.to_dict())
    return Sample.from_dict(out) if out is not None else None


@dataclass
class OnlineTraining:
    """The learning half of ``rlgate serve --online`` for one gateway."""

    options: OnlineOptions
    canary: Canary
    engines: TwoSlotEngine | None = None  # serves stable + canary (None: one version, no canary slot)
    trainer: OnlineTrainer | None = None
    groups: LiveGroups | None = None
    feedback: FeedbackTail | None = None  # set when the gateway binds its feedback store
    poll_interval: float = 0.25  # seconds between feedback polls
    redact: Redactor | None = None  # the operator's redaction hook (--redaction-hook): applied before the trainer
    withheld: int = 0  # samples the hook withheld (live groups here; feedback turns: FeedbackTail.counts)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # ------------------------------------------------------------------ gateway hooks

    def on_completed(self, interaction: Interaction, sampling: SamplingParams, conversation: str,
                     tenant: str | None) -> None:
        """A user's reply was recorded (never blocks: a live group, if any, starts as its own task)."""
        if self.groups is not None:
            self.groups.offer(interaction, sampling, conversation, tenant)

    def add_group(self, group: LiveGroup) -> None:
        """A scored live group goes to the trainer, through the redaction hook (a withheld sample drops the
        whole group: the rest would no longer be one prompt's replies)."""
        if self.trainer is None:
            return
        if self.redact is not None:
            kept = [redacted(self.redact, s) for s in group.samples]
            if any(s is None for s in kept):
                self.withheld += len(group.samples)
                return
            group = dataclasses.replace(group, samples=[s for s in kept if s is not None])
        self.trainer.add_group(group)

    def on_deletion(self, d: Deletion) -> None:
        """Data rights: nothing deleted stays queued, replayable or bound to a version."""
        if self.trainer is not None:
            if d.whole_tenant:
                self.trainer.forget(tenant=d.tenant)
            for c in d.conversation_ids:
                self.trainer.forget(conversation=c, tenant=d.tenant)
            self.trainer.forget_turns(frozenset(d.interaction_ids))  # the turns themselves, whatever their ids
        for sid in d.session_ids:  # the canary binds sessions (unique ids) to versions
            self.canary.forget(sid)

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        if self.trainer is not None:
            self._tasks.append(asyncio.create_task(self.trainer.run()))
        if self.feedback is not None:
            self._tasks.append(asyncio.create_task(self._tail_feedback()))

    async def _tail_feedback(self) -> None:
        assert self.feedback is not None
        while True:
            try:
                while self.feedback.poll():
                    pass
            except Exception:  # noqa: BLE001 - the tail must never die: log and poll again
                log.exception("reading feedback failed")
            await asyncio.sleep(self.poll_interval)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.groups is not None:
            await self.groups.close()
        if self.trainer is not None:
            await asyncio.to_thread(self.trainer.close)

    # ------------------------------------------------------------------ shown

    def snapshot(self) -> dict[str, Any]:
        return {"canary": self.canary.snapshot(),
                "trainer": dict(self.trainer.snapshot()) if self.trainer is not None else None,
                "groups": dict(self.groups.snapshot()) if self.groups is not None else None,
                "feedback": dict(self.feedback.counts) if self.feedback is not None else None,
                "withheld_by_redaction": self.withheld}

    def collect(self) -> Iterator[Metric]:
        """Prometheus families (a collector on the gateway's registry; docs/online.md lists them)."""
        c = self.canary
        g = GaugeMetricFamily("rlgate_online_version", "weight version by role (stable, canary)", labels=["role"])
        g.add_metric(["stable"], c.stable_version)
        if c.canary_version is not None:
            g.add_metric(["canary"], c.canary_version)
        yield g
        state = GaugeMetricFamily("rlgate_online_canary_state", "1 for the canary's current state",
                                  labels=["state"])
        current = c.snapshot()["state"]
        for s in ("stable", "canary", "pinned"):
            state.add_metric([s], 1.0 if s == current else 0.0)
        yield state
        rewards = GaugeMetricFamily("rlgate_online_canary_reward_mean", "mean live reward by weight version as "
                                    "the canary's test counts it (first reward of a turn, clipped to the range)",
                                    labels=["version"])
        counts = CounterMetricFamily("rlgate_online_canary_rewards", "live rewards the canary credited, by weight "
                                     "version",
                                     labels=["version"])
        for v, tally in sorted(c.rewards.items()):
            rewards.add_metric([str(v)], tally.mean)
            counts.add_metric([str(v)], tally.n)
        yield rewards
        yield counts
        decisions = CounterMetricFamily("rlgate_online_canary_decisions", "canary decisions kept, by action and "
                                        "who made them", labels=["action", "by"])
        by_action: dict[tuple[str, str], int] = {}
        for d in c.decisions:
            by_action[(d.action, d.by)] = by_action.get((d.action, d.by), 0) + 1
        for (action, by), n in sorted(by_action.items()):
            decisions.add_metric([action, by], n)
        yield decisions
        cmp = c.comparison()
        if cmp is not None:
            bounds = GaugeMetricFamily("rlgate_online_canary_difference", "canary minus stable mean reward: "
                                       "estimate and always-valid interval", labels=["bound"])
            for name, value in (("estimate", cmp.diff), ("lower", cmp.lower), ("upper", cmp.upper)):
                bounds.add_metric([name], value)
            yield bounds
        switched = CounterMetricFamily("rlgate_online_conversations_switched", "conversations moved off their "
                                       "version (rollback, or their slot reused)")
        switched.add_metric([], c.switched)
        yield switched
        if self.groups is not None:
            groups = CounterMetricFamily("rlgate_online_groups", "live groups by outcome", labels=["outcome"])
            for k in OUTCOMES:
                groups.add_metric([k], self.groups.counts[k])
            yield groups
            extra = CounterMetricFamily("rlgate_online_group_tokens", "extra tokens generated for live groups")
            extra.add_metric([], self.groups.extra_tokens)
            yield extra
        if self.trainer is not None:
            t = self.trainer
            samples = CounterMetricFamily("rlgate_online_train_samples", "online trainer samples by fate",
                                          labels=["fate"])
            for k, v in sorted(t.counts.items()):
                if k not in ("steps", "published"):
                    samples.add_metric([k], v)
            yield samples
            steps = CounterMetricFamily("rlgate_online_train_steps", "online training steps taken")
            steps.add_metric([], t.counts["steps"])
            yield steps
            pending = GaugeMetricFamily("rlgate_online_train_pending", "rewarded samples waiting for a step")
            pending.add_metric([], t.pending_samples)
            yield pending
            stale = GaugeMetricFamily("rlgate_online_train_staleness", "staleness of the last step's samples",
                                      labels=["unit", "stat"])
            for unit in ("versions", "hours"):
                for stat in ("mean", "max"):
                    stale.add_metric([unit, stat], t.last_step.get(f"staleness_{unit}_{stat}", 0.0))
            yield stale
