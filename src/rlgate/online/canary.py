"""Safe rollout: a new checkpoint serves a canary share of new conversations, and live reward decides.

The :class:`Canary` holds the rollout's state and makes its decisions; it knows nothing of engines
or HTTP (``online/versions.py`` serves the two weight sets, the admin routes call
:meth:`Canary.promote` / :meth:`Canary.rollback` / :meth:`Canary.pin`).

* **Routing.** A conversation is bound to the version that served its first turn and keeps it while
  that version is served (:meth:`route`). A new conversation goes to the canary with probability
  ``canary_share`` while a canary runs and nothing is pinned, else to the stable version. A
  conversation leaves its version only when that version stops being served: after a rollback (the
  canary is judged worse: its conversations move to stable at their next turn) or when its weights
  slot is reused for the next candidate (a promoted canary's previous stable version keeps serving
  its conversations until then); both are counted (``switched``) and logged.
* **Decisions.** Every live reward is credited to the version that produced the rewarded turn
  (:meth:`observe`). While a canary runs, after each reward the canary-minus-stable difference of
  mean rewards gets an always-valid interval (``online/sequential.py``: a confidence sequence, so
  looking after every reward is sound). Once the canary has ``canary_min_samples`` rewards:
  *roll back* when the interval's upper end is below 0 (worse, with confidence 1 - alpha);
  *promote* when its lower end is above ``-canary_margin`` (not worse than the margin). With a
  quality floor (``canary_floor``) the canary's own mean must also be shown at or above it (the lower
  end of its always-valid interval), and it is rolled back once shown below it. A promotion the
  reward-hacking guards hold (``hold``: ``online/hacking.py``) waits, recorded once as a ``hold``
  decision with the reason. Each decision is logged with its numbers and kept in :attr:`decisions`.
* **Operator.** ``pin``: no automatic decision and every new conversation on the stable version until
  unpinned; ``promote`` / ``rollback`` by hand act at once (the decision says ``by: operator``).
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rlgate.config import OnlineConfig
from rlgate.online.sequential import Comparison, RunningMean, compare, radius

log = logging.getLogger("rlgate.online.canary")

Action = Literal["start", "promote", "rollback", "pin", "unpin", "hold"]
# Versions whose reward tallies are kept for /metrics and /ui (the newest ones).
KEEP_VERSIONS = 16


@dataclass(frozen=True)
class Decision:
    """One change of the rollout, as logged and shown."""

    at: float  # unix time
    action: Action
    version: int  # the canary version it concerns (pin / unpin: the stable version)
    by: Literal["auto", "operator"]
    reason: str
    stable_version: int  # after the decision
    comparison: Comparison | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Binding:
    version: int
    last_seen: float


@dataclass
class Canary:
    """The rollout state of one gateway (see the module docstring)."""

    options: OnlineConfig
    stable_version: int = 0
    canary_version: int | None = None
    pinned: bool = False
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    rewards: dict[int, RunningMean] = field(default_factory=dict)  # per version (the newest KEEP_VERSIONS)
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=100))
    switched: int = 0  # conversations moved off their version (rollback, or its slot reused)
    listeners: list[Callable[[Decision], None]] = field(default_factory=list)
    # why the canary may not be promoted automatically now (None: nothing holds it): the reward-hacking guards
    hold: Callable[[int], str | None] | None = None
    _held: str | None = None  # the reason of the last hold decision recorded (one per reason)
    retired: int | None = None  # the stable version before the last promotion, while its slot still holds it
    _bindings: OrderedDict[str, _Binding] = field(default_factory=OrderedDict)
    _canary_started: float = 0.0

    # ------------------------------------------------------------------ routing

    def served(self) -> set[int]:
        """Versions a conversation may be served by now: stable, the canary, and the previous stable while its
        slot holds it (conversations bound to it keep it until the slot is reused for the next candidate)."""
        return {v for v in (self.stable_version, self.canary_version, self.retired) if v is not None}

    def route(self, conversation: str) -> int:
        """The version that serves this conversation's next turn (binding it on its first)."""
        now = self.clock()
        b = self._bindings.get(conversation)
        if b is not None and b.version in self.served():
            b.last_seen = now
            self._bindings.move_to_end(conversation)
            return b.version
        if b is not None:  # its version is no longer served
            self.switched += 1
            log.info("conversation %s moves from version %d to %d (%s)", conversation, b.version,
                     self.stable_version, "rolled back" if self._rolled_back(b.version) else "slot reused")
            version = self.stable_version
        elif self.canary_version is not None and not self.pinned and self.rng.random() < self.options.canary_share:
            version = self.canary_version
        else:
            version = self.stable_version
        self._bindings[conversation] = _Binding(version, now)
        self._bindings.move_to_end(conversation)
        while len(self._bindings) > self.options.max_conversations:
            self._bindings.popitem(last=False)
        return version

    def active_on(self, version: int) -> int:
        """Conversations bound to ``version`` with a turn within ``conversation_idle_s``."""
        horizon = self.clock() - self.options.conversation_idle_s
        return sum(1 for b in self._bindings.values() if b.version == version and b.last_seen >= horizon)

    def forget(self, conversation: str) -> None:
        """Data rights: a deleted conversation leaves no binding behind."""
        self._bindings.pop(conversation, None)

    def _rolled_back(self, version: int) -> bool:
        return any(d.action == "rollback" and d.version == version for d in self.decisions)

    # ------------------------------------------------------------------ rewards and the test

    def observe(self, version: int, reward: float) -> Decision | None:
        """Credit a live reward to the version that produced the turn; decide if the test says so."""
        lo, hi = self.options.reward_low, self.options.reward_high
        self._tally(version).add(min(max(reward, lo), hi))
        if self.canary_version is None or self.pinned:
            return None
        cmp = self.comparison()
        assert cmp is not None
        if cmp.n_canary < self.options.canary_min_samples or cmp.n_stable < self.options.canary_min_samples:
            return None
        numbers = (f"canary {cmp.n_canary} rewards, stable {cmp.n_stable}: difference {cmp.diff:+.3f}, "
                   f"{1 - self.options.canary_alpha:.0%} interval [{cmp.lower:+.3f}, {cmp.upper:+.3f}]")
        if cmp.upper < 0:
            return self._decide("rollback", "auto", f"worse than stable ({numbers})", cmp)
        floor = self.options.canary_floor
        if floor is not None:
            lo, hi = self.mean_interval(self.canary_version)
            at = f"canary mean {self.rewards[self.canary_version].mean:+.3f}, interval [{lo:+.3f}, {hi:+.3f}]"
            if hi < floor:
                return self._decide("rollback", "auto", f"below the quality floor {floor:+.3f} ({at})", cmp)
            if lo < floor:
                return None  # not yet shown to hold the floor
            numbers += f"; above the quality floor {floor:+.3f} ({at})"
        if cmp.lower > -self.options.canary_margin:
            held = self.hold(self.canary_version) if self.hold is not None else None
            if held is not None:
                if held != self._held:
                    self._held = held
                    self._record("hold", self.canary_version, "auto", f"promotion held: {held} ({numbers})", cmp)
                return None
            return self._decide("promote", "auto",
                                f"not worse than stable by more than {self.options.canary_margin} ({numbers})", cmp)
        return None

    def mean_interval(self, version: int) -> tuple[float, float]:
        """The always-valid interval of one version's mean reward (at alpha / 2, as in the comparison)."""
        o = self.options
        t = self._tally(version)
        r = radius(t.n, low=o.reward_low, high=o.reward_high, alpha=o.canary_alpha / 2, plan=o.canary_plan_samples)
        return max(t.mean - r, o.reward_low), min(t.mean + r, o.reward_high)

    def comparison(self) -> Comparison | None:
        """The running test of the canary against stable (None: no canary)."""
        if self.canary_version is None:
            return None
        o = self.options
        return compare(self._tally(self.stable_version), self._tally(self.canary_version), low=o.reward_low,
                       high=o.reward_high, alpha=o.canary_alpha, plan=o.canary_plan_samples)

    def _tally(self, version: int) -> RunningMean:
        tally = self.rewards.get(version)
        if tally is None:
            tally = self.rewards[version] = RunningMean()
            for old in sorted(self.rewards)[:-KEEP_VERSIONS]:
                if old not in self.served():
                    del self.rewards[old]
        return tally

    # ------------------------------------------------------------------ state changes

    def start(self, version: int, reason: str = "new checkpoint") -> Decision:
        """A candidate's weights are loaded: it serves the canary share of new conversations."""
        if self.canary_version is not None:
            raise ValueError(f"version {self.canary_version} is still the canary: promote or roll it back first")
        if version in self.rewards or version == self.stable_version:
            raise ValueError(f"version {version} was served before; a candidate needs a new version")
        self.canary_version = version
        self.retired = None  # its slot now holds the candidate
        self._held = None
        self._canary_started = self.clock()
        return self._record("start", version, "auto", reason)

    def promote(self, by: Literal["auto", "operator"] = "operator", reason: str = "operator") -> Decision:
        return self._decide("promote", by, reason, self.comparison())

    def rollback(self, by: Literal["auto", "operator"] = "operator", reason: str = "operator") -> Decision:
        return self._decide("rollback", by, reason, self.comparison())

    def pin(self, pinned: bool, reason: str = "operator") -> Decision:
        self.pinned = pinned
        return self._record("pin" if pinned else "unpin", self.stable_version, "operator", reason)

    def _decide(self, action: Action, by: Literal["auto", "operator"], reason: str,
                cmp: Comparison | None) -> Decision:
        if self.canary_version is None:
            raise ValueError("no canary is running")
        version = self.canary_version
        if action == "promote":
            self.retired, self.stable_version = self.stable_version, version
        self.canary_version = None
        return self._record(action, version, by, reason, cmp)

    def _record(self, action: Action, version: int, by: Literal["auto", "operator"], reason: str,
                cmp: Comparison | None = None) -> Decision:
        d = Decision(self.clock(), action, version, by, reason, self.stable_version, cmp)
        self.decisions.append(d)
        log.warning("canary %s of version %d by %s: %s", action, version, by, reason)
        for listener in self.listeners:
            listener(d)
        return d

    # ------------------------------------------------------------------ shown

    def snapshot(self) -> dict[str, Any]:
        """The state for /metrics, /ui and the admin route."""
        cmp = self.comparison()
        return {
            "stable_version": self.stable_version,
            "canary_version": self.canary_version,
            "retired_version": self.retired,
            "canary_share": self.options.canary_share,
            "pinned": self.pinned,
            "state": "pinned" if self.pinned else ("canary" if self.canary_version is not None else "stable"),
            "canary_running_s": self.clock() - self._canary_started if self.canary_version is not None else None,
            "comparison": asdict(cmp) if cmp is not None else None,
            "rewards": {str(v): {"n": t.n, "mean": t.mean} for v, t in sorted(self.rewards.items())},
            "switched_conversations": self.switched,
            "decisions": [d.to_dict() for d in list(self.decisions)[-20:]],
        }
