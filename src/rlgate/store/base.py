"""Persistence interface for sessions and interactions.

The :class:`~rlgate.server.sessions.SessionManager` keeps live state in memory and
writes every change through to a store. A store only has to persist and reload;
it never decides anything. ``MemoryStore`` persists nothing (``--store :memory:``).
"""

from __future__ import annotations

from typing import Protocol

from rlgate.trajectory.interaction import Interaction, Session


class Store(Protocol):
    def load(self) -> list[Session]:
        """All persisted sessions with their interactions (for restart)."""
        ...

    def save_session(self, session: Session) -> None:
        """Insert or update a session's own fields (not its interactions)."""
        ...

    def save_interaction(self, interaction: Interaction) -> None:
        """Insert or update one interaction."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Remove a session and its interactions."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """Keeps nothing beyond the process: the session manager's memory is the store."""

    def load(self) -> list[Session]:
        return []

    def save_session(self, session: Session) -> None:
        pass

    def save_interaction(self, interaction: Interaction) -> None:
        pass

    def delete_session(self, session_id: str) -> None:
        pass

    def close(self) -> None:
        pass
