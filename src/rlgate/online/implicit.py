"""Implicit feedback: what the gateway sees users do, without being told.

=============  ===============================================  ======================================
signal         seen when                                        about (``interaction_id``)
=============  ===============================================  ======================================
``regenerate`` a turn repeats an earlier turn's request exactly  the earlier reply (the one replaced)
               (same parent, same messages)
``edit``       a turn has an earlier turn's parent but other     the earlier reply; a fork in a named
               messages (the user edited and resent); or, in a  conversation: the conversation (None)
               named conversation, a turn forks (no parent)
``tool_error`` a turn's new messages hold a tool result that    the turn whose tool call failed (the
               failed (Anthropic ``is_error``, or text matching  parent)
               ``--tool-error-pattern``)
``abandon``    a conversation's latest turn got no follow-up    that turn
               within ``--abandon-after`` seconds
=============  ===============================================  ======================================

:class:`ImplicitSignals` scans the turns of tenant conversations every ``--implicit-scan-interval``
seconds, off the request path: each completed turn is looked at once (per process). An event's id
is a digest of (signal, turn, the turn that showed it), so a rescan after a restart stores nothing
twice. The scan also counts each completed turn for the feedback-rate metric.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlgate.online.conversations import CONVERSATION_KEY, Conversations, tenant_of
from rlgate.records.feedback import FeedbackEvent, ImplicitSignal
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["ImplicitSignals", "implicit_event_id", "version_of"]


def implicit_event_id(signal: str, target: str, trigger: str) -> str:
    return "imp-" + hashlib.sha256(f"{signal}\x1f{target}\x1f{trigger}".encode()).hexdigest()[:24]


def version_of(interaction: Interaction) -> int | None:
    """The weight version of a turn's last generated token (None: nothing generated)."""
    return interaction.output_versions[-1] if interaction.output_versions else None


@dataclass
class _Leaf:
    session_id: str
    turn: str
    conversation: str
    tenant: str
    at: float
    version: int | None


class ImplicitSignals:
    """The scanner (see the module docstring); ``emit`` stores an event, ``on_turn`` counts a turn."""

    def __init__(self, conversations: Conversations, *, tool_error_pattern: str, abandon_after: float,
                 emit: Callable[[FeedbackEvent], None], on_turn: Callable[[Interaction], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.conversations = conversations
        self.tool_error = re.compile(tool_error_pattern, re.IGNORECASE)
        self.abandon_after = abandon_after
        self.emit = emit
        self.on_turn = on_turn
        self.clock = clock
        self._done: dict[str, int] = {}  # session id -> interactions looked at (insertion order)
        self._leaves: dict[tuple[str, str], _Leaf] = {}  # (tenant, conversation) -> its latest turn

    def scan(self) -> int:
        """Look at new completed turns and expired leaves; returns the number of events emitted."""
        emitted = 0
        for session in list(self.conversations.online_sessions()):
            emitted += self._scan_session(session)
        if self.abandon_after > 0:
            cutoff = self.clock() - self.abandon_after
            for key, leaf in [(k, v) for k, v in self._leaves.items() if v.at <= cutoff]:
                del self._leaves[key]
                self._event("abandon", leaf.tenant, leaf.conversation, leaf.turn, leaf.turn, leaf.version)
                emitted += 1
        return emitted

    def forget(self, session_id: str, conversations: set[str] | None = None) -> None:
        """Deleted data: stop tracking the session (or only these conversations of it)."""
        if conversations is None:
            self._done.pop(session_id, None)
        for key, leaf in list(self._leaves.items()):
            if leaf.session_id == session_id and (conversations is None or leaf.conversation in conversations):
                del self._leaves[key]

    # ------------------------------------------------------------------ one session

    def _scan_session(self, session: Session) -> int:
        turns = list(session.interactions.values())
        start = self._done.get(session.id, 0)
        emitted = 0
        tenant = tenant_of(session)
        n = start
        for turn in turns[start:]:
            if turn.status == "pending":
                break  # look again next time (and at what follows it)
            n += 1
            if turn.status != "completed" or tenant is None:
                continue
            self.on_turn(turn)
            emitted += self._signals(session, tenant, turn, turns)
            conversation = self.conversations.conversation_of(session, turn)
            self._leaves[(tenant, conversation)] = _Leaf(session.id, turn.id, conversation, tenant,
                                                         turn.completed_at or turn.created_at, version_of(turn))
        self._done[session.id] = n
        return emitted

    def _signals(self, session: Session, tenant: str, turn: Interaction, turns: list[Interaction]) -> int:
        named = isinstance(session.metadata.get(CONVERSATION_KEY), str)
        conversation = self.conversations.conversation_of(session, turn)
        emitted = 0
        if turn.parent_id is not None or named:  # roots of the shared session are other conversations
            earlier = [t for t in turns if t is not turn and t.parent_id == turn.parent_id and t.completed
                       and t.created_at <= turn.created_at]
            if earlier:
                sibling = earlier[-1]
                signal: ImplicitSignal = "regenerate" if sibling.messages == turn.messages else "edit"
                self._event(signal, tenant, conversation, sibling.id, turn.id, version_of(sibling))
                emitted += 1
            elif turn.relation == "fork" and named:  # an earlier message changed: the conversation was edited
                self._event("edit", tenant, conversation, None, turn.id, None)
                emitted += 1
        parent = session.interactions.get(turn.parent_id) if turn.parent_id else None
        if parent is not None:
            new = turn.messages[len(parent.messages) + 1:]
            if any(m.role == "tool" and (m.is_error or self.tool_error.search(m.text)) for m in new):
                self._event("tool_error", tenant, conversation, parent.id, turn.id, version_of(parent))
                emitted += 1
        return emitted

    def _event(self, signal: ImplicitSignal, tenant: str, conversation: str, target: str | None, trigger: str,
               version: int | None) -> None:
        self.emit(FeedbackEvent(id=implicit_event_id(signal, target or conversation, trigger), tenant=tenant,
                                conversation_id=conversation, interaction_id=target, kind="implicit", value=signal,
                                source="implicit", created_at=self.clock(), policy_version=version,
                                metadata={"trigger": trigger}))
