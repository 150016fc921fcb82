"""A gateway restart: the sessions the store holds, read back for the :class:`~rlgate.core.sessions.SessionManager`."""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field

from rlgate.core.limits import image_size, images
from rlgate.store.base import Store
from rlgate.trajectory.interaction import Session
from rlgate.trajectory.tree import interaction_key, register_completed

log = logging.getLogger("rlgate.sessions")


def recorded_image_bytes(session: Session) -> int:
    """Image bytes a session's interactions added (those not re-sent from their parent)."""
    total = 0
    for i in session.interactions.values():
        parent = session.interactions.get(i.parent_id) if i.parent_id else None
        skip = len(parent.messages) + 1 if parent is not None else 0
        total += sum(image_size(p) for p in images(i.messages[skip:]))
    return total


@dataclass
class Restored:
    """What :func:`load_sessions` read back: the manager adopts it as it is."""

    capacity: int = 0
    sessions: dict[str, Session] = field(default_factory=dict)  # id -> session, created_at order
    by_key: dict[str, str] = field(default_factory=dict)  # key digest -> session id (not exported)
    finished: list[str] = field(default_factory=list)  # not exported yet, oldest first
    interrupted: int = 0  # sessions active at the stop, now ``interrupted``
    cut: int = 0  # generations the stop cut (interactions now ``failed``)


def load_sessions(store: Store, retain_exported: float) -> Restored:
    """Reload persisted sessions; sessions that were active become ``interrupted``.

    Keys of ended and interrupted sessions keep mapping to them (generation answers
    409 / 410 with the reason); keys of exported sessions stay retired (401). Exported sessions
    are deleted when no retention is configured (``retain_exported`` <= 0).
    """
    out = Restored(capacity=int(store.load_meta().get("capacity", 0)))
    for s in store.load():
        if s.exported_at is not None and retain_exported <= 0:
            store.delete_session(s.id)  # exported before the restart; no audit retention now
            continue
        if s.status == "active":
            s.status = "interrupted"
            s.ended_at = time.time()
            out.interrupted += 1
            store.save_session(s)
            log.debug("session %s was active at shutdown: marked interrupted", s.id)
        for i in s.interactions.values():
            if i.status == "pending":
                i.status = "failed"
                i.error = "gateway stopped during generation"
                out.cut += 1
                store.save_interaction(i)
            if i.completed:
                i.prefix_key = i.prefix_key or interaction_key(i)
                register_completed(s, i)
        s.last_active = max([s.last_active] + [i.completed_at or i.created_at for i in s.interactions.values()])
        s.image_bytes = recorded_image_bytes(s)
        out.sessions[s.id] = s
        if s.exported_at is None:  # later sessions (created_at order) win a reused key
            out.by_key[s.key_hash] = s.id
            out.finished.append(s.id)
    return out


def log_restored(restored: Restored, conversation: Callable[[Session], bool] | None) -> None:
    """One line for the restart. ``conversation`` names the sessions that hold a user's conversation
    (``rlgate serve --online``): one open at the stop is not an alarm (its next turn goes on in a new
    session) and the line says so instead of counting it "interrupted"."""
    if not restored.sessions:
        return
    words = {"open": "conversations open at the stop (each goes on in a new session at its next turn)",
             "interrupted": "interrupted (active at the stop)"}
    by_status = Tally("open" if s.status == "interrupted" and conversation and conversation(s) else s.status
                      for s in restored.sessions.values())
    log.log(logging.WARNING if by_status["interrupted"] else logging.INFO,
            "restored %d sessions from the store (%s), %d interactions, capacity %d", len(restored.sessions),
            ", ".join(f"{n} {words.get(k, k)}" for k, n in sorted(by_status.items())),
            sum(len(s.interactions) for s in restored.sessions.values()), restored.capacity)
