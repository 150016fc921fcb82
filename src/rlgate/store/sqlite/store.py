"""SQLiteStore: sessions and interactions in one SQLite file (stdlib ``sqlite3``, WAL mode).

Every ``save_*`` returns the change's write sequence number; :meth:`SQLiteStore.wait_durable`
is the barrier the gateway awaits with a request's numbers before it sends a response that
reports a change, so that "the client saw it" implies "it is durable" (docs/operations.md,
"Durability guarantee"). How writes reach the disk: :mod:`.commits`;
the row format: :mod:`.rows` and :mod:`.codec`; the files and their lock: :mod:`.files`;
tenants and feedback (``rlgate serve --online``): :mod:`.online`.
Keys: only ``key_hash`` (SHA-256 of the session key) exists on a session; keys are never
written anywhere.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlgate.store.base import StoreError, StoreOptions, Synchronous
from rlgate.store.sqlite.codec import to_json
from rlgate.store.sqlite.commits import GroupCommit
from rlgate.store.sqlite.files import lock_and_create
from rlgate.store.sqlite.online import SQLiteOnlineRecords
from rlgate.store.sqlite.rows import RowCodec
from rlgate.store.sqlite.schema import DYNAMIC_COLS, SESSION_COLS, STATIC_COLS, init_db
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["SQLiteStore"]


class SQLiteStore(SQLiteOnlineRecords):
    """SQLite store (see the module docstring). ``synchronous``: ``"full"``: a change is
    durable once the WAL holding it is fsynced (survives power loss); ``"normal"``: once it
    is committed to the WAL (survives a crash of the gateway process, not of the machine)."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: Synchronous = StoreOptions.store_sync) -> None:
        if synchronous not in ("full", "normal"):
            raise ValueError("synchronous must be 'full' or 'normal'")
        self.path = Path(path)
        self.synchronous = synchronous
        self._lock_fd = lock_and_create(self.path)
        try:
            conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            init_db(conn, self.path)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._rows = RowCodec()
        self._commits = GroupCommit(conn, self.path, synchronous=synchronous, on_failed=self._rows.forget_failed)

    @property
    def stats(self) -> dict[str, int]:
        """Commits, writes, failed writes, fsyncs and checkpoints so far."""
        return self._commits.stats

    @property
    def synced(self) -> bool:
        """Is every committed write durable (fsynced in "full" mode)?"""
        return self._commits.synced

    # ------------------------------------------------------------------ load (startup)

    def load_meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._commits.query("SELECT key, value FROM meta")}

    def load(self) -> list[Session]:
        try:
            sessions = self._commits.query(
                f"SELECT {', '.join(SESSION_COLS)} FROM sessions ORDER BY created_at, rowid")
            interactions = self._commits.query(
                f"SELECT {', '.join(STATIC_COLS + DYNAMIC_COLS)} FROM interactions ORDER BY seq")
        except sqlite3.Error as exc:  # a damaged file: one line at start-up, not a traceback
            raise StoreError(f"cannot read the store {self.path}: {exc}") from exc
        return self._rows.load(sessions, interactions)

    # ------------------------------------------------------------------ writes

    def save_session(self, session: Session) -> int:
        return self._commits.submit([self._rows.session(session)])

    def save_meta(self, key: str, value: Any) -> int:
        return self._commits.submit([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                      (key, to_json(value)))])

    def save_interaction(self, interaction: Interaction) -> int:
        if self._rows.is_inserted(interaction.id):
            # an insert still waiting for its commit takes the final values (one row write)
            seq = self._commits.amend(interaction.id, lambda ops: [self._rows.refresh_insert(ops[0], interaction)])
            if seq is not None:
                return seq
            return self._commits.submit([self._rows.interaction(interaction)])
        return self._commits.submit([self._rows.interaction(interaction)], key=interaction.id)

    def delete_session(self, session_id: str) -> int:
        return self._commits.submit(self._rows.delete_session(session_id))

    # ------------------------------------------------------------------ barrier and shutdown

    async def wait_durable(self, seqs: Sequence[int]) -> None:
        """Return once the writes numbered ``seqs`` are durable (see ``Store.wait_durable``)."""
        await self._commits.wait_durable(seqs)

    def flush(self, timeout: float | None = None) -> None:
        """Commit what is pending and block until it is durable."""
        self._commits.flush(timeout)

    def close(self) -> None:
        if self._commits.closed:
            return
        self._commits.close()
        os.close(self._lock_fd)
