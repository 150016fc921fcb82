"""Silent-failure guards: a windowed failure ratio with a threshold alarm.

A guard watches one kind of silent failure (tool calls that did not parse, empty replies,
forks, rewards missing at export, stale tokens, ...). Each observation reports how many
of its events failed (``observe(failures, events)``: one reply, one export, one poll of the
store). The guard keeps the last ``window`` observations and is **firing** while

    events in the window >= min_events  and  failures / events > threshold  (and failures > 0)

Alarms go to the log on transitions only: one WARNING when a guard starts firing (with the
numbers), one INFO when it recovers; never one line per request. ``/health`` reports
``degraded`` with the reasons of every firing guard; ``rlgate_guard_firing`` exports the state.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("rlgate.guards")


@dataclass(frozen=True)
class GuardSpec:
    name: str  # short id, the `guard` label and the key in /health
    what: str  # what a failed event is, in words ("tool-call blocks that did not parse")
    of: str  # what an event is ("tool-call blocks")
    threshold: float  # firing when the failure ratio exceeds this
    min_events: int  # ... and the window holds at least this many events


class Guard:
    """One guard (see module docstring). Not thread-safe: used from the event loop."""

    def __init__(self, spec: GuardSpec, window: int, detail: Callable[[], str] | None = None) -> None:
        if window < 1:
            raise ValueError("guard window must be >= 1")
        self.spec = spec
        self._obs: deque[tuple[int, int]] = deque()
        self._window = window
        self._failures = 0
        self._events = 0
        self._detail = detail  # extra words for the reason (e.g. forks by reason)
        self.firing = False
        self.alarms = 0  # how many times it started firing

    @property
    def failures(self) -> int:
        return self._failures

    @property
    def events(self) -> int:
        return self._events

    @property
    def ratio(self) -> float:
        return self._failures / self._events if self._events else 0.0

    def observe(self, failures: int, events: int) -> None:
        if events <= 0 and failures <= 0:
            return
        events = max(events, failures)
        self._obs.append((failures, events))
        self._failures += failures
        self._events += events
        if len(self._obs) > self._window:
            f, e = self._obs.popleft()
            self._failures -= f
            self._events -= e
        self._evaluate()

    def _evaluate(self) -> None:
        s = self.spec
        now = self._failures > 0 and self._events >= s.min_events and self.ratio > s.threshold
        if now and not self.firing:
            self.firing = True
            self.alarms += 1
            log.warning("guard %s: ALARM: %s (threshold %s; logged once until it recovers)",
                        s.name, self.reason(), _pct(s.threshold))
        elif not now and self.firing:
            self.firing = False
            log.info("guard %s recovered: %s", s.name, self.numbers())

    def numbers(self) -> str:
        return (f"{self._failures} of {self._events} {self.spec.of} ({_pct(self.ratio)}) "
                f"in the last {len(self._obs)} observations")

    def reason(self) -> str:
        text = f"{self.spec.what}: {self.numbers()}, above {_pct(self.spec.threshold)}"
        extra = self._detail() if self._detail is not None else ""
        return f"{text}; {extra}" if extra else text


class GuardSet:
    """The guards of one process, by name."""

    def __init__(self, specs: list[GuardSpec], window: int,
                 details: dict[str, Callable[[], str]] | None = None) -> None:
        details = details or {}
        self.guards = {s.name: Guard(s, window, details.get(s.name)) for s in specs}

    def __getitem__(self, name: str) -> Guard:
        return self.guards[name]

    def add(self, spec: GuardSpec, window: int, detail: Callable[[], str] | None = None) -> Guard:
        """Watch one more kind of failure (a part wired in later, e.g. online training); returns its guard."""
        if spec.name in self.guards:
            raise ValueError(f"guard {spec.name!r} exists already")
        guard = self.guards[spec.name] = Guard(spec, window, detail)
        return guard

    def observe(self, name: str, failures: int, events: int) -> None:
        self.guards[name].observe(failures, events)

    def degraded(self) -> list[dict[str, str]]:
        """``[{"guard": name, "reason": words}]`` for every firing guard."""
        return [{"guard": g.spec.name, "reason": g.reason()} for g in self.guards.values() if g.firing]


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"
