"""Persistence interface for sessions and interactions.

The :class:`~rlgate.core.sessions.SessionManager` keeps live state in memory and
writes every change through to a store. A store only has to persist and reload;
it never decides anything. ``MemoryStore`` persists nothing (``--store :memory:``);
:class:`~rlgate.store.sqlite.SQLiteStore` is the durable one.

Writes may be asynchronous (``SQLiteStore`` commits them in groups and fsyncs them on a
thread), so the interface has a barrier made of sequence numbers: every ``save_*`` /
``delete_session`` returns the number of its write (increasing; 0: nothing to wait for),
and :meth:`Store.wait_durable` returns once the given writes, and every write before
them, are durable, raising :class:`StoreError` if one of the given writes failed (or the
store was closed first). A request collects the numbers of its writes in its scope
(``core/request_scope.py``) and waits for them before a response that reports a change
is sent (see docs/operations.md, "Durability guarantee").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic.dataclasses import dataclass

from rlgate.config import OPTIONS, option
from rlgate.store.online import MemoryOnlineRecords
from rlgate.trajectory.interaction import Interaction, Session

Synchronous = Literal["full", "normal"]


@dataclass(config=OPTIONS)
class StoreOptions:
    """Where ``rlgate serve`` keeps sessions and trajectories (see docs/operations.md)."""

    store: str | None = option(None, "SQLite file for sessions and trajectories, or ':memory:' (keep nothing); "
                               "none: DATA_DIR/rlgate.sqlite", env="RLGATE_STORE", metavar="PATH")
    data_dir: str | None = option(None, "server data directory (none: $RLGATE_DATA_DIR, else $XDG_DATA_HOME/rlgate, "
                                  "else ~/.local/share/rlgate)", metavar="DIR")
    store_sync: Synchronous = option("full", "full: a change is durable once fsynced (survives power loss); "
                                     "normal: once written to the OS (survives a gateway crash only)")


class StoreError(Exception):
    """A write could not be made durable (disk full, I/O error, store closed)."""


class Store(Protocol):
    def load(self) -> list[Session]:
        """All persisted sessions with their interactions (for restart)."""
        ...

    def load_meta(self) -> dict[str, Any]:
        """Persisted gateway counters (e.g. ``capacity``)."""
        ...

    def save_session(self, session: Session) -> int:
        """Insert or update a session's own fields (not its interactions)."""
        ...

    def save_interaction(self, interaction: Interaction) -> int:
        """Insert or update one interaction."""
        ...

    def save_meta(self, key: str, value: Any) -> int:
        """Persist one gateway counter (JSON-serialisable value)."""
        ...

    def delete_session(self, session_id: str) -> int:
        """Remove a session and its interactions."""
        ...

    async def wait_durable(self, seqs: Sequence[int]) -> None:
        """Return once the writes numbered ``seqs`` (and all before them) are durable; raise
        StoreError if one of them failed or the store was closed before it was written."""
        ...

    def flush(self) -> None:
        """Block until every submitted write is durable."""
        ...

    def close(self) -> None:
        """Flush, then release the store. Idempotent."""
        ...


@runtime_checkable
class HasWriteStats(Protocol):
    """A store that counts its writes (``SQLiteStore``: commits, writes, failed writes, fsyncs) for the metrics."""

    @property
    def stats(self) -> dict[str, int]:
        ...


class MemoryStore(MemoryOnlineRecords):
    """Keeps nothing beyond the process: the session manager's memory is the store (and its own
    memory holds the online records: tenants, feedback)."""

    def load(self) -> list[Session]:
        return []

    def load_meta(self) -> dict[str, Any]:
        return {}

    def save_session(self, session: Session) -> int:
        return 0

    def save_interaction(self, interaction: Interaction) -> int:
        return 0

    def save_meta(self, key: str, value: Any) -> int:
        return 0

    def delete_session(self, session_id: str) -> int:
        return 0

    async def wait_durable(self, seqs: Sequence[int]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
