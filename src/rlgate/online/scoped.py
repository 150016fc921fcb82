"""The online records as requests write them: each write joins the request's durability barrier.

The online counterpart of ``core/request_scope.py``'s ``ScopedStore``: the online state holds only
this wrapper, so no tenant, feedback or deletion write can be answered 2xx before it is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rlgate.core.request_scope import current_scope
from rlgate.records.feedback import FeedbackEvent, FeedbackPage
from rlgate.records.tenants import Tenant
from rlgate.store.online import OnlineRecords

__all__ = ["ScopedOnlineRecords"]


def _noted(seq: int) -> int:
    scope = current_scope()
    if scope is not None and seq:
        scope.writes.append(seq)
    return seq


class ScopedOnlineRecords:
    """:class:`~rlgate.store.online.OnlineRecords` whose writes are recorded in the current request's scope."""

    def __init__(self, inner: OnlineRecords, durable: Any = None) -> None:
        self.inner = inner
        self.durable: Any = durable if durable is not None else inner  # the Store (wait_durable)

    def save_tenant(self, tenant: Tenant) -> int:
        return _noted(self.inner.save_tenant(tenant))

    def load_tenants(self) -> list[Tenant]:
        return self.inner.load_tenants()

    def delete_tenant(self, tenant_id: str) -> int:
        return _noted(self.inner.delete_tenant(tenant_id))

    def add_feedback(self, event: FeedbackEvent) -> int:
        return _noted(self.inner.add_feedback(event))

    def list_feedback(self, *, tenant: str | None = None, conversation_id: str | None = None,
                      interaction_id: str | None = None, after: int = 0, limit: int = 1000) -> FeedbackPage:
        return self.inner.list_feedback(tenant=tenant, conversation_id=conversation_id,
                                        interaction_id=interaction_id, after=after, limit=limit)

    def count_feedback(self, *, tenant: str, conversation_id: str | None = None,
                       interaction_id: str | None = None) -> int:
        return self.inner.count_feedback(tenant=tenant, conversation_id=conversation_id,
                                         interaction_id=interaction_id)

    def delete_feedback(self, *, tenant: str, conversation_id: str | None = None, pairs: Sequence[str] = (),
                        interaction_ids: Sequence[str] = ()) -> int:
        return _noted(self.inner.delete_feedback(tenant=tenant, conversation_id=conversation_id, pairs=pairs,
                                                 interaction_ids=interaction_ids))

    def purge_feedback(self, before: float) -> int:
        return _noted(self.inner.purge_feedback(before))

    def delete_interactions(self, session_id: str, interaction_ids: Sequence[str]) -> int:
        return _noted(self.inner.delete_interactions(session_id, interaction_ids))

    async def forget_deleted(self) -> None:
        """Once the current request's writes are durable, make the store's files forget what it deleted
        (``OnlineRecords.forget_deleted`` on a thread): the deletion's 2xx comes after both."""
        scope = current_scope()
        if scope is not None:
            await scope.wait_durable(self.durable)
        await asyncio.to_thread(self.inner.forget_deleted)
