"""What ``rlgate serve --online`` adds to a store: tenants, feedback events, and deleting turns.

:class:`OnlineRecords` is the interface (both stores have it: ``MemoryStore`` keeps the records in
memory through :class:`MemoryOnlineRecords`, ``SQLiteStore`` in its file,
``store/sqlite/online.py``). Writes return a write sequence number for the durability barrier,
as ``Store.save_*`` do. Feedback is listed in store order with an integer cursor (``after``), so
a trainer can tail it: each call returns the events after the cursor it was given and the
cursor to give next time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rlgate.records.feedback import FeedbackEvent, FeedbackPage
from rlgate.records.tenants import Tenant

__all__ = ["MemoryOnlineRecords", "OnlineRecords"]


@runtime_checkable
class OnlineRecords(Protocol):
    def save_tenant(self, tenant: Tenant) -> int:
        """Insert or update a tenant (its key digest, never its key)."""
        ...

    def load_tenants(self) -> list[Tenant]:
        ...

    def delete_tenant(self, tenant_id: str) -> int:
        """Forget the tenant's row (its data: :meth:`delete_feedback` and the sessions' deletion)."""
        ...

    def add_feedback(self, event: FeedbackEvent) -> int:
        """Store an event (an event whose id is stored already is not stored twice)."""
        ...

    def list_feedback(self, *, tenant: str | None = None, conversation_id: str | None = None,
                      interaction_id: str | None = None, after: int = 0, limit: int = 1000) -> FeedbackPage:
        """Events after the cursor ``after``, oldest first, at most ``limit``, filtered by what is given."""
        ...

    def count_feedback(self, *, tenant: str, conversation_id: str | None = None,
                       interaction_id: str | None = None) -> int:
        ...

    def delete_feedback(self, *, tenant: str, conversation_id: str | None = None, pairs: Sequence[str] = (),
                        interaction_ids: Sequence[str] = ()) -> int:
        """Delete a tenant's events: all of them when nothing else is given; else those of the conversation,
        those of the preference pairs (``metadata["pair"]``) and those about the turns given."""
        ...

    def purge_feedback(self, before: float) -> int:
        """Delete events created before this unix time."""
        ...

    def delete_interactions(self, session_id: str, interaction_ids: Sequence[str]) -> int:
        """Delete these turns of a session (a whole conversation tree: no other turn extends them)."""
        ...

    def forget_deleted(self) -> None:
        """Make the store's files forget what was deleted, once those deletions are durable (blocking: call
        it on a thread). SQLite: every WAL frame is checkpointed into the database file (whose deleted rows
        ``secure_delete`` zeroed) and the WAL truncated to 0 bytes; in memory: nothing to do."""
        ...


class MemoryOnlineRecords:
    """:class:`OnlineRecords` kept in the process (``--store :memory:``)."""

    def __init__(self) -> None:
        self._tenants: dict[str, Tenant] = {}
        self._feedback: dict[str, tuple[int, FeedbackEvent]] = {}  # id -> (seq, event), in store order
        self._feedback_seq = 0

    def save_tenant(self, tenant: Tenant) -> int:
        self._tenants[tenant.id] = tenant
        return 0

    def load_tenants(self) -> list[Tenant]:
        return list(self._tenants.values())

    def delete_tenant(self, tenant_id: str) -> int:
        self._tenants.pop(tenant_id, None)
        return 0

    def add_feedback(self, event: FeedbackEvent) -> int:
        if event.id not in self._feedback:
            self._feedback_seq += 1
            self._feedback[event.id] = (self._feedback_seq, event)
        return 0

    def _matching(self, tenant: str | None, conversation_id: str | None,
                  interaction_id: str | None) -> list[tuple[int, FeedbackEvent]]:
        return [(s, e) for s, e in self._feedback.values()
                if (tenant is None or e.tenant == tenant)
                and (conversation_id is None or e.conversation_id == conversation_id)
                and (interaction_id is None or e.interaction_id == interaction_id)]

    def list_feedback(self, *, tenant: str | None = None, conversation_id: str | None = None,
                      interaction_id: str | None = None, after: int = 0, limit: int = 1000) -> FeedbackPage:
        rows = [(s, e) for s, e in self._matching(tenant, conversation_id, interaction_id) if s > after][:limit]
        return FeedbackPage([e for _, e in rows], rows[-1][0] if rows else after)

    def count_feedback(self, *, tenant: str, conversation_id: str | None = None,
                       interaction_id: str | None = None) -> int:
        return len(self._matching(tenant, conversation_id, interaction_id))

    def delete_feedback(self, *, tenant: str, conversation_id: str | None = None, pairs: Sequence[str] = (),
                        interaction_ids: Sequence[str] = ()) -> int:
        everything = conversation_id is None and not pairs and not interaction_ids
        doomed = [e for _, e in self._matching(tenant, None, None)
                  if everything or e.conversation_id == conversation_id or e.metadata.get("pair") in pairs
                  or e.interaction_id in interaction_ids]
        for e in doomed:
            del self._feedback[e.id]
        return 0

    def purge_feedback(self, before: float) -> int:
        for _, e in [r for r in self._feedback.values() if r[1].created_at < before]:
            del self._feedback[e.id]
        return 0

    def delete_interactions(self, session_id: str, interaction_ids: Sequence[str]) -> int:
        return 0  # the session manager's memory was the only copy

    def forget_deleted(self) -> None:
        return None  # nothing on disk
