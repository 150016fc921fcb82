"""Feedback rate and live reward per policy version (``rlgate serve --online``), for /metrics and /ui.

Registered on the gateway's own registry (``GatewayMetrics.registry``). Per weight version (the
version of a turn's last generated token):

* ``rlgate_online_turns_total{policy_version}``: completed turns of tenant conversations;
* ``rlgate_online_turns_with_feedback_total{policy_version}``: of those, turns that got explicit or
  delayed feedback (counted once, at the first): the feedback rate is the ratio;
* ``rlgate_feedback_events_total{kind, source}``: events stored;
* ``rlgate_online_reward_mean{policy_version}`` / ``rlgate_online_rewarded_turns{policy_version}``:
  the mean of the turns' current rewards (``RewardMap``; a turn's reward replaces its previous one
  when more feedback arrives) and how many turns it averages.

What it remembers is bounded: the last reward of the newest ``MAX_TRACKED`` turns (an older turn's
reward stays in its version's mean, and a newer event on it counts as a new turn) and the newest
``MAX_VERSIONS`` versions' label sets (older ones are removed from the exposition).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["FeedbackMetrics", "VersionStats"]

MAX_TRACKED = 100_000
MAX_VERSIONS = 32
NO_VERSION = "none"


@dataclass
class VersionStats:
    """One version's numbers (what /ui shows)."""

    version: str
    turns: int = 0
    turns_with_feedback: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0

    @property
    def feedback_rate(self) -> float | None:
        return self.turns_with_feedback / self.turns if self.turns else None

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None


class FeedbackMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.turns = Counter("rlgate_online_turns", "completed turns of tenant conversations", ["policy_version"],
                             registry=registry)
        self.turns_with_feedback = Counter("rlgate_online_turns_with_feedback", "turns that got explicit or "
                                           "delayed feedback (at the first)", ["policy_version"], registry=registry)
        self.events = Counter("rlgate_feedback_events", "feedback events stored", ["kind", "source"],
                              registry=registry)
        self.reward_mean = Gauge("rlgate_online_reward_mean", "mean current reward of rewarded turns",
                                 ["policy_version"], registry=registry)
        self.rewarded = Gauge("rlgate_online_rewarded_turns", "turns with a reward", ["policy_version"],
                              registry=registry)
        self.by_version: OrderedDict[str, VersionStats] = OrderedDict()
        self._last: OrderedDict[str, tuple[str, float]] = OrderedDict()  # target -> (version, reward)
        self._with_feedback: OrderedDict[str, None] = OrderedDict()  # turns counted in turns_with_feedback

    def _stats(self, version: int | None) -> VersionStats:
        label = NO_VERSION if version is None else str(version)
        stats = self.by_version.get(label)
        if stats is None:
            stats = self.by_version[label] = VersionStats(label)
            while len(self.by_version) > MAX_VERSIONS:
                old, _ = self.by_version.popitem(last=False)
                for metric in (self.turns, self.turns_with_feedback, self.reward_mean, self.rewarded):
                    try:
                        metric.remove(old)
                    except KeyError:
                        pass
        return stats

    def record_turn(self, version: int | None) -> None:
        stats = self._stats(version)
        stats.turns += 1
        self.turns.labels(stats.version).inc()

    def record_event(self, kind: str, source: str, turn: str | None, version: int | None) -> None:
        self.events.labels(kind, source).inc()
        if turn is None or source == "implicit" or turn in self._with_feedback:
            return
        self._with_feedback[turn] = None
        if len(self._with_feedback) > MAX_TRACKED:
            self._with_feedback.popitem(last=False)
        stats = self._stats(version)
        stats.turns_with_feedback += 1
        self.turns_with_feedback.labels(stats.version).inc()

    def record_reward(self, target: str, version: int | None, reward: float | None) -> None:
        """``target``'s reward is now ``reward`` (None: no signal any more)."""
        stats = self._stats(version)
        previous = self._last.pop(target, None)
        if previous is not None and previous[0] in self.by_version:
            old = self.by_version[previous[0]]
            old.rewarded -= 1
            old.reward_sum -= previous[1]
            self._publish(old)
        if reward is not None:
            stats.rewarded += 1
            stats.reward_sum += reward
            self._last[target] = (stats.version, reward)
            if len(self._last) > MAX_TRACKED:
                self._last.popitem(last=False)
        self._publish(stats)

    def _publish(self, stats: VersionStats) -> None:
        self.rewarded.labels(stats.version).set(stats.rewarded)
        if stats.reward_mean is not None:
            self.reward_mean.labels(stats.version).set(stats.reward_mean)
