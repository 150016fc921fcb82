"""Feedback events -> one reward: a declarative map from config, never code from a request.

Each event gives a *signal* ``s`` and its kind a *weight* ``w`` (``--reward-weight KIND=W``,
:class:`~rlgate.config.OnlineConfig.reward_weights`):

==============  ===============================  ======================================
event           signal s                         which events of a target count
==============  ===============================  ======================================
thumbs          +1 up, -1 down                   the latest (a change of mind replaces)
rating 1..5     (rating - 3) / 2, in [-1, 1]     the latest
outcome         its value                        the latest
preference      +1 preferred, -1 the other       each
implicit        1 (weight of its signal name)    each (regenerate, edit, abandon, tool_error)
comment         none                             none (no reward)
==============  ===============================  ======================================

``combine="mean"`` (default): reward = sum(w * s) / sum(|w|) over the counted events with a
non-zero weight, so with signals in [-1, 1] the reward is too (a lone regenerate at weight -1 is
-1; a thumbs up with a regenerate is 0). ``"sum"``: sum(w * s). No counted event: ``None`` (no
signal yet: a trainer waits, or uses something else).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlgate.config import OnlineConfig
from rlgate.records.feedback import FEEDBACK_KINDS, IMPLICIT_SIGNALS, FeedbackEvent

__all__ = ["DEFAULT_WEIGHTS", "WEIGHT_NAMES", "RewardMap", "parse_weights"]

# What can be weighted: the explicit kinds, and each implicit signal by its name.
WEIGHT_NAMES: tuple[str, ...] = tuple(k for k in FEEDBACK_KINDS if k not in ("comment", "implicit")) + IMPLICIT_SIGNALS
DEFAULT_WEIGHTS: dict[str, float] = {"thumbs": 1.0, "rating": 1.0, "preference": 1.0, "outcome": 1.0,
                                     "regenerate": -1.0, "edit": -0.5, "tool_error": -1.0, "abandon": 0.0}
_LATEST_ONLY = ("thumbs", "rating", "outcome")


def parse_weights(items: Sequence[str]) -> dict[str, float]:
    """``["thumbs=1", "abandon=-0.2"]`` over the defaults; ``ValueError`` names a bad item."""
    weights = dict(DEFAULT_WEIGHTS)
    for item in items:
        name, sep, number = item.partition("=")
        name = name.strip()
        if not sep or name not in WEIGHT_NAMES:
            raise ValueError(f"--reward-weight {item!r}: expected KIND=WEIGHT with KIND one of {', '.join(WEIGHT_NAMES)}")
        try:
            weights[name] = float(number)
        except ValueError:
            raise ValueError(f"--reward-weight {item!r}: {number!r} is not a number") from None
        if weights[name] != weights[name] or abs(weights[name]) == float("inf"):
            raise ValueError(f"--reward-weight {item!r}: the weight must be finite")
    return weights


@dataclass(frozen=True)
class RewardMap:
    """The configured map (see the module docstring); ``RewardMap.from_config(config)``."""

    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    combine: Literal["mean", "sum"] = "mean"

    @classmethod
    def from_config(cls, config: OnlineConfig) -> RewardMap:
        return cls(parse_weights(config.reward_weights), config.reward_combine)

    def signal(self, event: FeedbackEvent) -> tuple[str, float] | None:
        """(weight name, signal) of one event; None for an event that carries no reward."""
        if event.kind == "comment" or isinstance(event.value, str) and event.kind != "implicit":
            return None
        if event.kind == "implicit":
            return str(event.value), 1.0
        value = float(event.value)
        if event.kind == "rating":
            return "rating", (value - 3.0) / 2.0
        return event.kind, value

    def reward(self, events: Sequence[FeedbackEvent]) -> float | None:
        """One reward from a turn's (or a conversation's) events; None when none of them counts."""
        latest: dict[str, FeedbackEvent] = {}
        counted: list[tuple[str, float]] = []
        for e in sorted(events, key=lambda e: e.created_at):
            if e.kind in _LATEST_ONLY:
                latest[e.kind] = e
                continue
            s = self.signal(e)
            if s is not None:
                counted.append(s)
        for e in latest.values():
            s = self.signal(e)
            if s is not None:
                counted.append(s)
        weighted = [(self.weights.get(name, 0.0), s) for name, s in counted]
        weighted = [(w, s) for w, s in weighted if w != 0.0]
        if not weighted:
            return None
        total = sum(w * s for w, s in weighted)
        if self.combine == "sum":
            return total
        return total / sum(abs(w) for w, _ in weighted)
