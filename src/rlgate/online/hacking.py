"""Reward hacking, watched: the known signs in the replies each weight version serves, against a reference.

A policy trained on live rewards learns whatever raises them, and the cheap ways are known: empty
replies, repeated tokens, degenerate text, word salad off the language users speak (approval for
"has the word *the*" was won by "worldertoo thereMotherort fatherThere"), a collapsed sampling
distribution, and a reward that rises while a held-out check falls. :class:`HackingGuards` watches
every user reply (``GenerationService.completed_listeners``) per weight version:

==========================  ====================================================================
guard                       a reply counts when
==========================  ====================================================================
``online_empty``            it has no visible text
``online_repetitive``       8+ tokens of which fewer than 30% are distinct, or one 3-gram makes up
                            half of its 3-grams
``online_degenerate``       it has text but no letter or digit, or holds U+FFFD (bytes that are
                            not text)
``online_off_distribution`` 2+ words and more than half of them unknown: never seen in the users'
                            messages nor in the reference version's replies
``online_entropy_collapse`` (per version, not per reply) the mean surprisal of sampled tokens
                            (-logprob at T > 0, an estimate of the sampling entropy) falls below
                            ``hacking_entropy_ratio`` x the reference's
``online_same_reply``       (per version) its most frequent reply (case and spacing aside) makes up
                            more of its window than the reference's most frequent reply did of the
                            reference's (margin and significance as the reply guards): one answer
                            whatever the users asked, the harm a collapse does to them
``online_heldout_drop``     (per candidate) the operator's held-out check (``--heldout-check``)
                            scores the candidate more than ``heldout_margin`` below stable
==========================  ====================================================================

**The reference** is the version served when the gateway started (the model before any online
learning): its first ``hacking_reference_replies`` replies (with every user message) give the
vocabulary, its next ``hacking_reference_replies`` the reference rate of each sign and its mean
surprisal. A version's guard fires when, over its last ``hacking_window`` replies (at least
``hacking_min_replies``), its rate exceeds the reference's by more than ``hacking_margin`` and by more
than three standard errors of the difference (so the noise of a small window does not fire it); it
recovers when that no longer holds. Until the reference is measured nothing fires, and with ``hacking_action``
``pause`` or ``rollback`` no candidate is promoted automatically (a hack needs no time to be learned).

**Short, sure replies** are not a collapse: a policy that learned to answer "52" to "Which is larger, 47
or 52? Answer with the number only." has a low surprisal per token, and ``online_entropy_collapse`` fires
on it (measured on SmolLM2, docs/online.md). ``online_same_reply`` tells the two apart (the learned policy's
replies still follow the questions); ``hacking_alarm_only`` names guards that only alarm, never hold or roll
back a candidate, for such a task: ``--hacking-alarm-only online_entropy_collapse``.

**What a firing guard does** (``hacking_action``): ``alarm`` - a WARNING line, the gateway's guard
(``/health`` degraded, ``rlgate_guard_firing``) and the record in ``GET /rl/online``; ``pause`` -
that too, and the canary is not promoted automatically while a guard fires on it (a ``hold``
decision says why; it may still be rolled back, and the operator may promote it); ``rollback`` -
a candidate a guard fires on is rolled back at once.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlgate.config import OnlineConfig

__all__ = ["REPLY_GUARDS", "HackingGuards", "ReplyFlags", "flags_of"]

log = logging.getLogger("rlgate.online.hacking")

REPLY_GUARDS = ("online_empty", "online_repetitive", "online_degenerate", "online_off_distribution")
VERSION_GUARDS = ("online_entropy_collapse", "online_same_reply", "online_heldout_drop")
GUARDS = REPLY_GUARDS + VERSION_GUARDS
_WORD = re.compile(r"[^\W\d_]+")  # runs of letters (any script)
MAX_VOCABULARY = 200_000  # words remembered (user messages keep adding)
KEEP_VERSIONS = 8  # versions whose windows are kept (the newest)


@dataclass(frozen=True)
class ReplyFlags:
    """The signs one reply shows (``None`` surprisal: greedy or no token)."""

    empty: bool
    repetitive: bool
    degenerate: bool
    off_distribution: bool
    surprisal: float | None  # mean -logprob of its sampled tokens
    key: str = ""  # the reply's text, case and spacing aside (the same-reply guard counts equal keys)

    def flag(self, guard: str) -> bool:
        return bool(getattr(self, guard.removeprefix("online_")))


def check_guard_names(names: Sequence[str], what: str) -> None:
    """``ValueError`` naming any of ``names`` that is not a guard (``what``: the setting, as the user wrote it)."""
    unknown = sorted(set(names) - set(GUARDS))
    if unknown:
        raise ValueError(f"{what}: unknown guard(s) {', '.join(unknown)}; known: {', '.join(GUARDS)}")


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def flags_of(text: str, token_ids: Sequence[int], logprobs: Sequence[float], temperature: float,
             vocabulary: set[str] | None) -> ReplyFlags:
    """The signs of one reply (``vocabulary`` None: off-distribution is not judged yet)."""
    stripped = text.strip()
    n = len(token_ids)
    grams = [tuple(token_ids[i:i + 3]) for i in range(max(n - 2, 0))]
    top = Counter(grams).most_common(1)[0][1] if grams else 0
    repetitive = n >= 8 and (len(set(token_ids)) / n < 0.3 or top * 2 >= len(grams))
    degenerate = bool(stripped) and (not any(ch.isalnum() for ch in stripped) or "\ufffd" in stripped)
    ws = words(stripped)
    off = vocabulary is not None and len(ws) >= 2 and sum(w not in vocabulary for w in ws) * 2 > len(ws)
    surprisal = -sum(logprobs) / len(logprobs) if logprobs and temperature > 0 else None
    return ReplyFlags(not stripped, repetitive, degenerate, off, surprisal, reply_key(stripped))


def reply_key(text: str) -> str:
    """What makes two replies "the same" for ``online_same_reply``: the text, case and spacing aside
    (its first 200 characters)."""
    return " ".join(text.casefold().split())[:200]


@dataclass
class _Window:
    flags: deque[ReplyFlags]
    counts: Counter[str]
    surprisal_sum: float = 0.0
    surprisal_n: int = 0
    replies: Counter[str] = field(default_factory=Counter)  # reply key -> replies in the window

    def add(self, f: ReplyFlags) -> None:
        if len(self.flags) == self.flags.maxlen:
            self._take(self.flags[0], -1)
        self.flags.append(f)
        self._take(f, 1)

    def _take(self, f: ReplyFlags, sign: int) -> None:
        for g in REPLY_GUARDS:
            if f.flag(g):
                self.counts[g] += sign
        if f.surprisal is not None:
            self.surprisal_sum += sign * f.surprisal
            self.surprisal_n += sign
        self.replies[f.key] += sign
        if self.replies[f.key] <= 0:
            del self.replies[f.key]

    def rate(self, guard: str) -> float:
        return self.counts[guard] / len(self.flags) if self.flags else 0.0

    @property
    def same_reply(self) -> tuple[int, str]:
        """(replies equal to the window's most frequent one, that reply's key)."""
        if not self.replies:
            return 0, ""
        key, n = self.replies.most_common(1)[0]
        return n, key

    @property
    def surprisal(self) -> float | None:
        return self.surprisal_sum / self.surprisal_n if self.surprisal_n else None


def _significant(p1: float, n1: int, p0: float, n0: int, z: float = 3.0) -> bool:
    """``p1`` above ``p0`` by more than ``z`` standard errors of the difference (pooled two-proportion test):
    a guard does not fire on the noise of a small window or a small reference."""
    if not n1 or not n0:
        return False
    p = (p1 * n1 + p0 * n0) / (n1 + n0)
    se = (p * (1 - p) * (1 / n1 + 1 / n0)) ** 0.5
    return p1 - p0 > z * se if se > 0 else p1 > p0


class HackingGuards:
    """Per-version reply guards against the reference version (see the module docstring)."""

    def __init__(self, options: OnlineConfig, reference_version: int, clock: Callable[[], float] = time.time) -> None:
        check_guard_names(options.hacking_alarm_only, "hacking_alarm_only")
        self.options = options
        self.reference_version = reference_version
        self.clock = clock
        self.vocabulary: set[str] = set()
        self._vocabulary_replies = 0
        self._reference = _Window(deque(maxlen=max(options.hacking_reference_replies, 1)), Counter())
        self.reference: dict[str, float] | None = None  # rates and mean surprisal, once measured
        self.windows: dict[int, _Window] = {}
        self.heldout: dict[int, float] = {}  # version -> held-out score
        self.firing: dict[tuple[str, int], str] = {}  # (guard, version) -> reason
        self.alarms: Counter[str] = Counter()
        self.record: deque[dict[str, Any]] = deque(maxlen=200)  # fired / recovered, with numbers
        self.listeners: list[Callable[[str, int, bool, str], None]] = []  # (guard, version, firing, reason)

    # ------------------------------------------------------------------ input

    def observe_user(self, text: str) -> None:
        """A user's message: its words are in the language users speak."""
        if len(self.vocabulary) < MAX_VOCABULARY:
            self.vocabulary.update(words(text))

    def observe(self, version: int, text: str, token_ids: Sequence[int], logprobs: Sequence[float],
                temperature: float) -> ReplyFlags:
        """One served reply of ``version``; evaluates that version's guards."""
        o = self.options
        learning = version == self.reference_version and self._vocabulary_replies < o.hacking_reference_replies
        f = flags_of(text, token_ids, logprobs, temperature, None if learning else self.vocabulary)
        if learning:
            self._vocabulary_replies += 1
            if len(self.vocabulary) < MAX_VOCABULARY:
                self.vocabulary.update(words(text))
            return f
        if version == self.reference_version and self.reference is None:
            self._reference.add(f)
            if len(self._reference.flags) >= o.hacking_reference_replies:
                ref = self._reference
                self.reference = {g: ref.rate(g) for g in REPLY_GUARDS}
                self.reference["surprisal"] = ref.surprisal if ref.surprisal is not None else 0.0
                self.reference["online_same_reply"] = ref.same_reply[0] / len(ref.flags)
                log.info("reward-hacking guards: reference measured on %d replies of version %d: %s", len(ref.flags),
                         version, ", ".join(f"{k} {v:.3f}" for k, v in self.reference.items()))
        w = self.windows.get(version)
        if w is None:
            w = self.windows[version] = _Window(deque(maxlen=max(o.hacking_window, 1)), Counter())
            for old in sorted(self.windows)[:-KEEP_VERSIONS]:
                del self.windows[old]
        w.add(f)
        self._evaluate(version, w)
        return f

    def observe_heldout(self, version: int, score: float, stable_version: int, stable_score: float,
                        reward_diff: float | None) -> None:
        """The held-out check's score of a candidate, and of the stable version it would replace."""
        self.heldout[version], self.heldout[stable_version] = score, stable_score
        drop = stable_score - score
        reason = (f"held-out score {score:.3f} on version {version} against {stable_score:.3f} on stable version "
                  f"{stable_version} (a drop of {drop:+.3f}, margin {self.options.heldout_margin}); live reward "
                  f"difference {'unknown' if reward_diff is None else f'{reward_diff:+.3f}'}")
        self._set("online_heldout_drop", version, drop > self.options.heldout_margin, reason)

    # ------------------------------------------------------------------ decisions

    def _evaluate(self, version: int, w: _Window) -> None:
        o, ref = self.options, self.reference
        if ref is None:
            return
        enough = len(w.flags) >= o.hacking_min_replies
        n_ref = len(self._reference.flags)
        for g in REPLY_GUARDS:
            rate = w.rate(g)
            reason = (f"{w.counts[g]} of the last {len(w.flags)} replies of version {version} ({rate:.1%}) against "
                      f"{ref[g]:.1%} of {n_ref} on the reference version {self.reference_version} (margin "
                      f"{o.hacking_margin:.0%})")
            self._set(g, version, enough and rate - ref[g] > o.hacking_margin
                      and _significant(rate, len(w.flags), ref[g], n_ref), reason)
        s = w.surprisal
        if s is not None and ref["surprisal"] > 0:
            reason = (f"mean surprisal {s:.3f} nats per sampled token on version {version} against "
                      f"{ref['surprisal']:.3f} on the reference (below {o.hacking_entropy_ratio:g} x)")
            self._set("online_entropy_collapse", version, enough and s < o.hacking_entropy_ratio * ref["surprisal"],
                      reason)
        same, key = w.same_reply
        rate, ref_rate = same / len(w.flags), ref["online_same_reply"]
        reason = (f"{same} of the last {len(w.flags)} replies of version {version} ({rate:.1%}) are the same reply "
                  f"({key[:60]!r}) against {ref_rate:.1%} of {n_ref} for the reference's most frequent (margin "
                  f"{o.hacking_margin:.0%})")
        self._set("online_same_reply", version, enough and rate - ref_rate > o.hacking_margin
                  and _significant(rate, len(w.flags), ref_rate, n_ref), reason)

    def _set(self, guard: str, version: int, firing: bool, reason: str) -> None:
        key = (guard, version)
        was = key in self.firing
        if firing:
            self.firing[key] = reason
        if firing == was:
            return
        if not firing:
            del self.firing[key]
        else:
            self.alarms[guard] += 1
        self.record.append({"at": self.clock(), "guard": guard, "version": version,
                            "event": "fired" if firing else "recovered", "reason": reason})
        log.log(logging.WARNING if firing else logging.INFO, "guard %s %s on version %d: %s", guard,
                "FIRED" if firing else "recovered", version, reason)
        for listener in list(self.listeners):
            listener(guard, version, firing, reason)

    def firing_on(self, version: int) -> list[tuple[str, str]]:
        return [(g, r) for (g, v), r in self.firing.items() if v == version]

    def acts_on(self, guard: str) -> bool:
        """Whether ``guard`` firing may hold or roll back a candidate (not one of ``hacking_alarm_only``)."""
        return self.options.hacking_action != "alarm" and guard not in self.options.hacking_alarm_only

    def holding(self, version: int) -> str | None:
        """Why ``version`` may not be promoted automatically now (None: nothing holds it)."""
        if self.options.hacking_action == "alarm":
            return None
        firing = [(g, r) for g, r in self.firing_on(version) if self.acts_on(g)]
        if firing:
            return "; ".join(f"guard {g}: {r}" for g, r in firing)
        if self.reference is None:
            return ("the reward-hacking guards have not measured the reference yet "
                    f"({self._vocabulary_replies + len(self._reference.flags)} of "
                    f"{2 * self.options.hacking_reference_replies} replies of version {self.reference_version})")
        if self.options.heldout_check and version not in self.heldout:
            return f"the held-out check has not scored version {version} yet"
        w = self.windows.get(version)
        if w is None or len(w.flags) < self.options.hacking_min_replies:
            return (f"the guards have seen {0 if w is None else len(w.flags)} of {self.options.hacking_min_replies} "
                    f"replies of version {version}")
        return None

    # ------------------------------------------------------------------ shown

    def snapshot(self) -> dict[str, Any]:
        return {
            "action": self.options.hacking_action,
            "reference_version": self.reference_version,
            "reference": self.reference,
            "vocabulary_words": len(self.vocabulary),
            "alarm_only": list(self.options.hacking_alarm_only),
            "versions": {str(v): {"replies": len(w.flags), **{g: round(w.rate(g), 4) for g in REPLY_GUARDS},
                                  "online_same_reply": round(w.same_reply[0] / len(w.flags), 4) if w.flags else 0.0,
                                  "surprisal": w.surprisal} for v, w in sorted(self.windows.items())},
            "heldout": {str(v): s for v, s in sorted(self.heldout.items())},
            "firing": [{"guard": g, "version": v, "reason": r} for (g, v), r in self.firing.items()],
            "alarms": dict(self.alarms),
            "record": list(self.record)[-50:],
        }
