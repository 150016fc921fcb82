"""The online records (``store/online.py``) in the SQLite file: tables ``tenants`` and ``feedback``
(``schema.py``), and deleting a conversation's turns from ``interactions``.

Writes go through the store's group commit like every other change (a 2xx means durable); reads
first commit what is pending, so they see every write submitted before them. Feedback values and
metadata are JSON; the cursor is the row's ``seq`` (AUTOINCREMENT: a deleted event's number is
never handed out again, so a trainer's cursor never skips a new event).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rlgate.records.feedback import FeedbackEvent, FeedbackPage
from rlgate.records.tenants import Tenant
from rlgate.store.sqlite.codec import to_json
from rlgate.store.sqlite.commits import GroupCommit
from rlgate.store.sqlite.rows import RowCodec

__all__ = ["SQLiteOnlineRecords"]

_FEEDBACK_COLS = ("id", "tenant", "conversation_id", "interaction_id", "kind", "value", "source", "created_at",
                  "policy_version", "metadata")
_TENANT_COLS = ("id", "name", "key_hash", "created_at", "revoked_at")


def _where(tenant: str | None, conversation_id: str | None, interaction_id: str | None) -> tuple[str, tuple[Any, ...]]:
    terms, params = [], []
    for col, value in (("tenant", tenant), ("conversation_id", conversation_id), ("interaction_id", interaction_id)):
        if value is not None:
            terms.append(f"{col}=?")
            params.append(value)
    return " AND ".join(terms) or "1", tuple(params)


def _event(row: Sequence[Any]) -> FeedbackEvent:
    return FeedbackEvent(id=row[0], tenant=row[1], conversation_id=row[2], interaction_id=row[3], kind=row[4],
                         value=json.loads(row[5]), source=row[6], created_at=row[7], policy_version=row[8],
                         metadata=json.loads(row[9]))


class SQLiteOnlineRecords:
    """Mixed into :class:`~rlgate.store.sqlite.store.SQLiteStore` (which sets ``_commits`` and ``_rows``)."""

    _commits: GroupCommit
    _rows: RowCodec

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        self._commits.commit_pending()
        return self._commits.query(sql, params)

    # ------------------------------------------------------------------ tenants

    def save_tenant(self, tenant: Tenant) -> int:
        row = (tenant.id, tenant.name, tenant.key_hash, tenant.created_at, tenant.revoked_at)
        return self._commits.submit([(f"INSERT OR REPLACE INTO tenants ({', '.join(_TENANT_COLS)}) "
                                      f"VALUES ({', '.join('?' * len(_TENANT_COLS))})", row)])

    def load_tenants(self) -> list[Tenant]:
        rows = self._read(f"SELECT {', '.join(_TENANT_COLS)} FROM tenants ORDER BY created_at, rowid")
        return [Tenant(*row) for row in rows]

    def delete_tenant(self, tenant_id: str) -> int:
        return self._commits.submit([("DELETE FROM tenants WHERE id=?", (tenant_id,))])

    # ------------------------------------------------------------------ feedback

    def add_feedback(self, event: FeedbackEvent) -> int:
        row = (event.id, event.tenant, event.conversation_id, event.interaction_id, event.kind, to_json(event.value),
               event.source, event.created_at, event.policy_version, to_json(event.metadata))
        return self._commits.submit([(f"INSERT OR IGNORE INTO feedback ({', '.join(_FEEDBACK_COLS)}) "
                                      f"VALUES ({', '.join('?' * len(_FEEDBACK_COLS))})", row)])

    def list_feedback(self, *, tenant: str | None = None, conversation_id: str | None = None,
                      interaction_id: str | None = None, after: int = 0, limit: int = 1000) -> FeedbackPage:
        where, params = _where(tenant, conversation_id, interaction_id)
        rows = self._read(f"SELECT seq, {', '.join(_FEEDBACK_COLS)} FROM feedback WHERE {where} AND seq > ? "
                          "ORDER BY seq LIMIT ?", (*params, after, limit))
        return FeedbackPage([_event(r[1:]) for r in rows], rows[-1][0] if rows else after)

    def count_feedback(self, *, tenant: str, conversation_id: str | None = None,
                       interaction_id: str | None = None) -> int:
        where, params = _where(tenant, conversation_id, interaction_id)
        return int(self._read(f"SELECT COUNT(*) FROM feedback WHERE {where}", params)[0][0])

    def delete_feedback(self, *, tenant: str, conversation_id: str | None = None, pairs: Sequence[str] = (),
                        interaction_ids: Sequence[str] = ()) -> int:
        if conversation_id is None and not pairs and not interaction_ids:
            return self._commits.submit([("DELETE FROM feedback WHERE tenant=?", (tenant,))])
        terms: list[str] = []
        params: list[Any] = [tenant]
        if conversation_id is not None:
            terms.append("conversation_id=?")
            params.append(conversation_id)
        if pairs:
            terms.append(f"json_extract(metadata, '$.pair') IN ({', '.join('?' * len(pairs))})")
            params += list(pairs)
        if interaction_ids:
            terms.append(f"interaction_id IN ({', '.join('?' * len(interaction_ids))})")
            params += list(interaction_ids)
        return self._commits.submit([(f"DELETE FROM feedback WHERE tenant=? AND ({' OR '.join(terms)})",
                                      tuple(params))])

    def purge_feedback(self, before: float) -> int:
        return self._commits.submit([("DELETE FROM feedback WHERE created_at < ?", (before,))])

    # ------------------------------------------------------------------ turns

    def delete_interactions(self, session_id: str, interaction_ids: Sequence[str]) -> int:
        ids = list(interaction_ids)
        if not ids:
            return 0
        self._rows.forget(session_id, ids)
        marks = ", ".join("?" * len(ids))
        return self._commits.submit([(f"DELETE FROM interactions WHERE session_id=? AND id IN ({marks})",
                                      (session_id, *ids))])

    def forget_deleted(self) -> None:
        self._commits.truncate_wal()
