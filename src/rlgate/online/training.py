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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rlgate.config import OnlineConfig
from rlgate.engine.base import SamplingParams
from rlgate.metrics.guards import GuardSet, GuardSpec
from rlgate.online.canary import Canary, Decision
from rlgate.online.feedback_source import FeedbackTail
from rlgate.online.groups import OUTCOMES, LiveGroup, LiveGroups
from rlgate.online.hacking import GUARDS, HackingGuards
from rlgate.online.heldout import HeldOutCheck, heldout_score, load_heldout
from rlgate.online.redaction import Redactor
from rlgate.online.rights import Deletion
from rlgate.online.trainer import OnlineTrainer
from rlgate.online.versions import TwoSlotEngine
from rlgate.supervised import forever
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

    options: OnlineConfig
    canary: Canary
    engines: TwoSlotEngine | None = None  # serves stable + canary (None: one version, no canary slot)
    trainer: OnlineTrainer | None = None
    groups: LiveGroups | None = None
    feedback: FeedbackTail | None = None  # set when the gateway binds its feedback store
    poll_interval: float = 0.25  # seconds between feedback polls
    redact: Redactor | None = None  # the operator's redaction hook (--redaction-hook): applied before the trainer
    withheld: int = 0  # samples the hook withheld (live groups here; feedback turns: FeedbackTail.counts)
    hacking: HackingGuards | None = None  # the reward-hacking guards (built by __post_init__)
    heldout: HeldOutCheck | None = None  # the operator's held-out check (--heldout-check)
    encode: Callable[[list[dict[str, Any]]], list[int]] | None = None  # chat messages -> prompt ids (held-out)
    decode: Callable[[list[int]], str] | None = None
    stop_token_ids: tuple[int, ...] = ()
    trainer_settings: dict[str, Any] | None = None  # the trainer's grpo: and train: sections, as GET /rl/online shows
    policy: str | None = None  # the adapter policy it trains (online/learners.py); None: the default policy
    weights_path: Callable[[int], str | None] | None = None  # where a version's weights are on disk (adapters)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _side: set[asyncio.Task[None]] = field(default_factory=set)  # held-out runs
    _gateway_guards: GuardSet | None = None
    _fleet: Callable[[], list[OnlineTraining]] | None = None  # every training sharing the gateway's guards

    def __post_init__(self) -> None:
        if self.hacking is None:
            self.hacking = HackingGuards(self.options, self.canary.stable_version)
        self.canary.hold = self.hacking.holding
        self.canary.listeners.append(self._on_decision)
        self.hacking.listeners.append(self._on_guard)
        if self.heldout is None and self.options.heldout_check:
            self.heldout = load_heldout(self.options.heldout_check)

    # ------------------------------------------------------------------ gateway hooks

    def on_completed(self, interaction: Interaction, sampling: SamplingParams, conversation: str,
                     tenant: str | None) -> None:
        """A user's reply was recorded (never blocks: a live group, if any, starts as its own task); the
        reward-hacking guards look at it."""
        if self.groups is not None:
            self.groups.offer(interaction, sampling, conversation, tenant)
        if self.hacking is not None and interaction.output_versions:
            users = [m for m in interaction.messages if m.role == "user"]
            if users:
                self.hacking.observe_user(users[-1].text)
            out = interaction.output_message
            self.hacking.observe(interaction.output_versions[-1], out.text if out is not None else "",
                                 interaction.output_ids, interaction.output_logprobs, sampling.temperature)

    def _on_guard(self, guard: str, version: int, firing: bool, reason: str) -> None:
        if self._gateway_guards is not None and self.hacking is not None:  # firing while it fires on any version
            fleet = self._fleet() if self._fleet is not None else [self]
            self._gateway_guards.observe(guard, int(any(g == guard for t in fleet if t.hacking is not None
                                                        for g, _ in t.hacking.firing)), 1)
        c = self.canary
        if firing and self.options.hacking_action == "rollback" and version == c.canary_version \
                and self.hacking is not None and self.hacking.acts_on(guard):
            c.rollback("auto", f"guard {guard} fired on the canary: {reason}")

    def _on_decision(self, d: Decision) -> None:
        """A candidate started: run the held-out check on it (and on stable, once per version)."""
        if d.action != "start" or self.heldout is None or self.engines is None or self.encode is None:
            return
        task = asyncio.get_running_loop().create_task(self._score_heldout(d.version))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _score_heldout(self, version: int) -> None:
        assert self.heldout is not None and self.engines is not None and self.encode is not None
        assert self.hacking is not None
        o, c = self.options, self.canary
        decode = self.decode or (lambda ids: "")
        try:
            stable = c.stable_version
            scores = {}
            for v in (version, stable):
                if v in self.hacking.heldout and v != version:
                    scores[v] = self.hacking.heldout[v]
                    continue
                scores[v] = await heldout_score(self.heldout, self.engines.slot_of(v), encode=self.encode,
                                                decode=decode, stop_token_ids=self.stop_token_ids,
                                                max_tokens=o.heldout_max_tokens, tag=f"v{v}")
            cmp = c.comparison()
            self.hacking.observe_heldout(version, scores[version], stable, scores[stable],
                                         cmp.diff if cmp is not None and cmp.n_canary else None)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged; the candidate stays held (pause) until scored
            log.exception("held-out check of version %d failed", version)

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

    def add_guards(self, guards: GuardSet) -> None:
        """Join the gateway's guards (``/health``, ``rlgate_guard_firing``): training steps stopped for a
        non-finite value (firing while one of the last 100 steps was), and each reward-hacking guard (firing
        while it fires on some version; the reasons in ``/health``)."""
        register_guards(guards, lambda: [self], steps=self.trainer is not None)
        self.attach_guards(guards, lambda: [self])

    def attach_guards(self, guards: GuardSet, fleet: Callable[[], list[OnlineTraining]]) -> None:
        """Report to guards :func:`register_guards` added for ``fleet`` (this training among them)."""
        if self.trainer is not None:
            self.trainer.alarm = guards.observe
        if self.hacking is not None:
            self._gateway_guards, self._fleet = guards, fleet

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        if self.trainer is not None:
            self._tasks.append(asyncio.create_task(self.trainer.run()))
        if self.feedback is not None:
            self._tasks.append(asyncio.create_task(self._tail_feedback()))

    async def _tail_feedback(self) -> None:
        feedback = self.feedback
        assert feedback is not None

        def read_all() -> None:
            while feedback.poll():
                pass

        await forever(read_all, wait=self.poll_interval, what="reading feedback", log=log, at_once=True)

    async def close(self) -> None:
        for t in [*self._tasks, *self._side]:
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
                "guards": self.hacking.snapshot() if self.hacking is not None else None,
                "trainer": dict(self.trainer.snapshot()) if self.trainer is not None else None,
                "trainer_settings": self.trainer_settings,
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


def register_guards(guards: GuardSet, fleet: Callable[[], list[OnlineTraining]], *, steps: bool = True) -> None:
    """The online guards, once per gateway, for the trainings in ``fleet`` (one, or one per adapter policy
    learning online): ``nonfinite_steps`` and each reward-hacking guard, its reasons naming the policy."""
    if steps:
        guards.add(GuardSpec("nonfinite_steps", "online training steps stopped for a non-finite loss, "
                             "gradient or weight", "training steps", 0.0, 1), window=100)
    for name in GUARDS:
        def detail(name: str = name) -> str:
            return " | ".join((f"{t.policy}: " if t.policy is not None else "") + r for t in fleet()
                              if t.hacking is not None for (g, _), r in t.hacking.firing.items() if g == name)
        guards.add(GuardSpec(name, f"reward hacking ({name.removeprefix('online_').replace('_', ' ')})",
                             "checks", 0.0, 1), window=1, detail=detail)
