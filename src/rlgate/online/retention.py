"""Retention: conversations and feedback older than ``--data-retention-hours`` are deleted.

Every ``--retention-interval`` seconds: a conversation whose last turn is older than the limit is
deleted as if on request (``DataRights``, reason ``"retention"``: subscribers hear of it), and
feedback events created before the limit are purged. 0 hours: nothing is purged by age.
"""

from __future__ import annotations

import logging
import time

from rlgate.errors import Conflict
from rlgate.online.conversations import CONVERSATION_KEY, Conversations, tenant_of
from rlgate.online.rights import DataRights
from rlgate.online.scoped import ScopedOnlineRecords

__all__ = ["purge_expired"]

log = logging.getLogger("rlgate.online.retention")


def purge_expired(conversations: Conversations, rights: DataRights, records: ScopedOnlineRecords, hours: float,
                  now: float | None = None) -> int:
    """Delete what is older than ``hours`` (see the module docstring); returns conversations deleted."""
    if hours <= 0:
        return 0
    cutoff = (time.time() if now is None else now) - hours * 3600.0
    expired: dict[tuple[str, str], float] = {}
    latest: dict[tuple[str, str], float] = {}
    for session in list(conversations.online_sessions()):
        tenant = tenant_of(session)
        if tenant is None:
            continue
        named = session.metadata.get(CONVERSATION_KEY)
        if isinstance(named, str):
            latest[(tenant, named)] = max(latest.get((tenant, named), 0.0), session.last_active)
            continue
        for turn in session.interactions.values():
            key = (tenant, conversations.conversation_of(session, turn))
            latest[key] = max(latest.get(key, 0.0), turn.completed_at or turn.created_at)
    expired = {k: t for k, t in latest.items() if t < cutoff}
    deleted = 0
    for tenant, conversation in expired:
        try:
            rights.delete_conversation(tenant, conversation, reason="retention")
            deleted += 1
        except Conflict:  # a turn in flight: it is not that old after all; next time
            continue
    records.purge_feedback(cutoff)
    if deleted:
        log.info("retention: %d conversations older than %.1f h deleted", deleted, hours)
    return deleted
