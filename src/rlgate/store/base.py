"""Persistence interface for sessions and interactions.

The :class:`~rlgate.core.sessions.SessionManager` keeps live state in memory and
writes every change through to a store. A store only has to persist and reload;
it never decides anything. ``MemoryStore`` persists nothing (``--store :memory:``);
:class:`~rlgate.store.sqlite.SQLiteStore` is the durable one.

Writes may be asynchronous (``SQLiteStore`` commits them on a writer thread), so the
interface has a barrier: :meth:`Store.wait_durable` returns once every write submitted
before the call is durable. The gateway awaits it before a response that reports a
change is sent (see docs/operations.md, "Durability guarantee").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rlgate.config import option
from rlgate.trajectory.interaction import Interaction, Session

Synchronous = Literal["full", "normal"]


@dataclass
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

    def save_session(self, session: Session) -> None:
        """Insert or update a session's own fields (not its interactions)."""
        ...

    def save_interaction(self, interaction: Interaction) -> None:
        """Insert or update one interaction."""
        ...

    def save_meta(self, key: str, value: Any) -> None:
        """Persist one gateway counter (JSON-serialisable value)."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Remove a session and its interactions."""
        ...

    async def wait_durable(self) -> None:
        """Return once every write submitted before this call is durable (raise StoreError if one failed)."""
        ...

    def flush(self) -> None:
        """Block until every submitted write is durable."""
        ...

    def close(self) -> None:
        """Flush, then release the store. Idempotent."""
        ...


class MemoryStore:
    """Keeps nothing beyond the process: the session manager's memory is the store."""

    def load(self) -> list[Session]:
        return []

    def load_meta(self) -> dict[str, Any]:
        return {}

    def save_session(self, session: Session) -> None:
        pass

    def save_interaction(self, interaction: Interaction) -> None:
        pass

    def save_meta(self, key: str, value: Any) -> None:
        pass

    def delete_session(self, session_id: str) -> None:
        pass

    async def wait_durable(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
