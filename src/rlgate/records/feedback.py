"""Feedback on what the policy said: one immutable :class:`FeedbackEvent` per signal, of any kind.

Explicit feedback comes from ``POST /v1/feedback`` (a user's thumbs, a 1-5 rating, a pairwise
preference, a comment); delayed outcomes come the same way, hours later if need be (source
``"delayed"``: a reward for something that happened after the conversation, e.g. "the PR was
merged"); implicit signals are seen by the gateway itself (``online/implicit.py``). Every event is
stored durably with its time (``Store.add_feedback``) and listed by conversation or since a cursor
(``Store.list_feedback``), so a trainer can tail them; ``online/reward_map.py`` turns a turn's or a
conversation's events into one reward.

Values, by kind (:func:`check_value` enforces them):

==============  ==============================================================================
kind            value
==============  ==============================================================================
``thumbs``      ``1.0`` (up) or ``-1.0`` (down)
``rating``      a number from 1 to 5
``preference``  ``1.0`` on the preferred reply, ``-1.0`` on the other: one pairwise preference is
                two events sharing ``metadata["pair"]``, each naming the other reply in
                ``metadata["other"]``
``comment``     the text (it carries no reward)
``outcome``     a finite number within the configured range (``--outcome-low`` .. ``--outcome-high``,
                default -1 .. 1): the outcome's reward; outside it the request is refused
                (400), so no single event can outweigh every other reward
``implicit``    the signal: ``regenerate``, ``edit``, ``abandon`` or ``tool_error``
==============  ==============================================================================
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = ["FEEDBACK_KINDS", "IMPLICIT_SIGNALS", "FeedbackEvent", "FeedbackKind", "FeedbackPage", "FeedbackSource",
           "ImplicitSignal", "check_value", "new_feedback_id"]

FeedbackKind = Literal["thumbs", "rating", "preference", "comment", "outcome", "implicit"]
FeedbackSource = Literal["explicit", "implicit", "delayed"]
ImplicitSignal = Literal["regenerate", "edit", "abandon", "tool_error"]
FEEDBACK_KINDS: tuple[str, ...] = get_args(FeedbackKind)
IMPLICIT_SIGNALS: tuple[str, ...] = get_args(ImplicitSignal)


@dataclass(frozen=True)
class FeedbackEvent:
    """One feedback signal, as stored (immutable: a change of mind is a newer event)."""

    id: str  # "fb-..." (explicit, delayed) or a digest of what triggered it (implicit: stored once)
    tenant: str  # the tenant whose conversation it is about
    conversation_id: str  # the conversation (the X-Conversation-Id a client sent, else its first turn's id)
    interaction_id: str | None  # the turn (the response / message id the client got back); None: the conversation
    kind: FeedbackKind
    value: float | str  # see the module docstring
    source: FeedbackSource
    created_at: float = field(default_factory=time.time)  # unix time the gateway received or saw it
    policy_version: int | None = None  # weight version of the turn's last generated token (None: unknown)
    metadata: dict[str, Any] = field(default_factory=dict)  # JSON object (preference pair, client notes)


@dataclass(frozen=True)
class FeedbackPage:
    """Events in store order and the cursor to pass as ``after`` for the next ones."""

    events: list[FeedbackEvent]
    cursor: int  # the store's sequence number of the last event returned (the ``after`` given when none)


def new_feedback_id() -> str:
    return "fb-" + secrets.token_hex(12)


def check_value(kind: str, value: Any, *, max_comment_chars: int,
                outcome_range: tuple[float, float] = (-1.0, 1.0)) -> float | str:
    """The value stored for ``kind`` (see the module docstring); ``ValueError`` says what is wrong."""
    if kind not in FEEDBACK_KINDS:
        raise ValueError(f"unknown feedback kind {kind!r} (one of {', '.join(FEEDBACK_KINDS)})")
    if kind in ("comment", "implicit"):
        if not isinstance(value, str) or not value:
            raise ValueError(f"a {kind} value is a non-empty string")
        if kind == "implicit" and value not in IMPLICIT_SIGNALS:
            raise ValueError(f"unknown implicit signal {value!r} (one of {', '.join(IMPLICIT_SIGNALS)})")
        if len(value) > max_comment_chars:
            raise ValueError(f"a comment holds at most {max_comment_chars} characters")
        return value
    if kind == "thumbs" and isinstance(value, bool):
        return 1.0 if value else -1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"a {kind} value is a finite number")
    number = float(value)
    if kind in ("thumbs", "preference") and number not in (1.0, -1.0):
        raise ValueError(f"a {kind} value is 1 or -1")
    if kind == "rating" and not 1.0 <= number <= 5.0:
        raise ValueError("a rating is from 1 to 5")
    low, high = outcome_range
    if kind == "outcome" and not low <= number <= high:
        raise ValueError(f"an outcome is a number from {low:g} to {high:g} (the gateway's --outcome-low and "
                         "--outcome-high): one event must not outweigh every other reward")
    return number
