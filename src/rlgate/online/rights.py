"""Data rights: deleting a tenant's or a conversation's data on request, everywhere it is.

:class:`DataRights` deletes, in this order: the turns (the conversation's sessions, or its tree
of turns in the tenant's shared session) from memory and from the store, the feedback events,
and - for a tenant - the tenant itself when asked; then :class:`DeletionNotifier` tells every
subscriber (``on_delete``), so that whoever holds copies drops them: the continuous trainer's
pending batches and replay buffer (part 2), an exporter's queue. A subscriber is called once the
store writes were submitted, on the event loop; it must not block. A 2xx answer to a deletion
request means the deletion is durable (the request's writes joined its durability barrier).

Exports already handed out (``/export_trajectories``, ``/rl/collect``) are outside the gateway:
the deletion names their session and interaction ids so that their holder can act on them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from rlgate.core.request_scope import on_write_failure
from rlgate.core.sessions import SessionManager
from rlgate.errors import Conflict
from rlgate.online.conversations import Conversations
from rlgate.online.implicit import ImplicitSignals
from rlgate.online.scoped import ScopedOnlineRecords
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["DataRights", "Deletion", "DeletionNotifier"]

log = logging.getLogger("rlgate.online.rights")


@dataclass(frozen=True)
class Deletion:
    """What was deleted (a subscriber drops everything that names one of these)."""

    tenant: str
    conversation_ids: tuple[str, ...]  # the deleted conversations (all the tenant's for a tenant deletion)
    session_ids: tuple[str, ...]  # sessions removed whole
    interaction_ids: tuple[str, ...]  # every deleted turn, whole sessions' turns included
    reason: str = "request"  # "request" | "retention"
    whole_tenant: bool = False


@dataclass
class DeletionNotifier:
    """Subscribers to deletions (``on_delete``); :meth:`notify` calls each, logging any failure."""

    _callbacks: list[Callable[[Deletion], None]] = field(default_factory=list)

    def on_delete(self, callback: Callable[[Deletion], None]) -> Callable[[], None]:
        """Call ``callback`` with every future :class:`Deletion`; returns a function that unsubscribes."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def notify(self, deletion: Deletion) -> None:
        for callback in list(self._callbacks):
            try:
                callback(deletion)
            except Exception:  # noqa: BLE001 - one subscriber's bug must not stop the others' deletion
                log.exception("a deletion subscriber failed (tenant %s)", deletion.tenant)


class DataRights:
    """Deletes a conversation's or a tenant's data (see the module docstring)."""

    def __init__(self, sessions: SessionManager, conversations: Conversations, records: ScopedOnlineRecords,
                 implicit: ImplicitSignals | None = None) -> None:
        self.sessions = sessions
        self.conversations = conversations
        self.records = records
        self.implicit = implicit
        self.notifier = DeletionNotifier()
        self.on_feedback_deleted: Callable[[str], None] | None = None  # a tenant's events were deleted
        self.deleted = {"conversations": 0, "tenants": 0, "sessions": 0, "turns": 0}

    def delete_conversation(self, tenant: str, conversation_id: str, *, reason: str = "request") -> Deletion:
        """Delete a conversation (a header-less one may be named by any of its turns: its tree goes whole),
        its feedback, and both events of every preference that named one of its replies (the other event
        is stored under the other reply's conversation, and names this one's reply)."""
        conversation_id = self.conversations.canonical(tenant, conversation_id)
        found = self.conversations.turns_of(tenant, conversation_id)
        deletion = self._delete(tenant, found, {conversation_id}, reason=reason, whole_tenant=False)
        pairs = {str(e.metadata["pair"]) for e in self.records.list_feedback(
            tenant=tenant, conversation_id=conversation_id, limit=1_000_000).events if "pair" in e.metadata}
        self.records.delete_feedback(tenant=tenant, conversation_id=conversation_id, pairs=sorted(pairs),
                                     interaction_ids=deletion.interaction_ids)
        if self.on_feedback_deleted is not None:
            self.on_feedback_deleted(tenant)
        self.deleted["conversations"] += 1
        self.notifier.notify(deletion)
        return deletion

    def delete_tenant_data(self, tenant: str, *, reason: str = "request") -> Deletion:
        found = [(s, list(s.interactions.values())) for s in self.conversations.sessions_of(tenant)]
        conversations = {self.conversations.conversation_of(s, i) for s, turns in found for i in turns}
        deletion = self._delete(tenant, found, conversations, reason=reason, whole_tenant=True)
        self.records.delete_feedback(tenant=tenant)
        if self.on_feedback_deleted is not None:
            self.on_feedback_deleted(tenant)
        self.deleted["tenants"] += 1
        self.notifier.notify(deletion)
        return deletion

    def _delete(self, tenant: str, found: list[tuple[Session, list[Interaction]]], conversations: set[str], *,
                reason: str, whole_tenant: bool) -> Deletion:
        busy = [s.id for s, _ in found if s.in_flight]
        if busy:  # a reply still being generated would be written after the deletion
            raise Conflict("a turn of this data is being generated right now; retry once it is answered",
                           code="generation_in_flight")
        session_ids, turn_ids = [], []
        for session, turns in found:
            ids = [i.id for i in turns]
            turn_ids += ids
            if len(ids) == len(session.interactions):  # the whole session (a named conversation, or all of it)
                self.sessions.delete_session(session)
                self.conversations.forget(session)
                on_write_failure(functools.partial(self.conversations.remember, session))
                session_ids.append(session.id)
                if self.implicit is not None:
                    self.implicit.forget(session.id)
            else:  # trees of the tenant's shared session
                self.sessions.forget_interactions(session, ids)
                self.records.delete_interactions(session.id, ids)
                if self.implicit is not None:
                    self.implicit.forget(session.id, conversations)
        self.deleted["sessions"] += len(session_ids)
        self.deleted["turns"] += len(turn_ids)
        log.info("deleted (%s) tenant %s: %d conversations, %d sessions, %d turns", reason, tenant,
                 len(conversations), len(session_ids), len(turn_ids))
        return Deletion(tenant, tuple(sorted(conversations)), tuple(session_ids), tuple(turn_ids), reason,
                        whole_tenant)
