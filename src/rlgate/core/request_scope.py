"""What one request leaves to do around its response: wait for its writes, run deferred work,
undo its in-memory changes if its writes failed.

The ASGI layer opens a :class:`RequestScope` per request (:func:`begin_request` /
:func:`end_request`); code below it does not know about HTTP:

* :class:`ScopedStore` wraps the store: every ``save_*`` / ``delete_session`` made through it
  is recorded in the current request's scope, by the wrapper itself (the session manager holds
  only the wrapper, so no write can bypass the barrier); before a response (or a stream's final
  event) reports a change, :meth:`RequestScope.wait_durable` awaits exactly the writes the
  request made so far (``Store.wait_durable``);
* :func:`after_response`: run once the response was sent (outside a request: at once);
* :func:`on_durable`: run once the request's writes are durable, before its answer is sent
  (bookkeeping that counts a change only if it is kept);
* :func:`on_write_failure`: undo an in-memory change if the store fails to write the
  request's changes (outside a request: never). Whoever sees the request's
  :class:`~rlgate.store.base.StoreError` calls :func:`undo_changes`, so that a change the
  client was refused (503) leaves nothing in memory a later request could land on;
* :func:`store_refusal`: the one answer to a failed write: undo, log, and the 503
  (``store_unavailable``) to raise or send, wherever the failure is seen (the error handler, the
  durability middleware, a stream's final event).

Outside a request (startup, the idle sweeper) there is no scope: writes are not waited
for, and deferred work runs at once. The current scope is found through a context
variable, so tasks a request starts (a streamed body) share it.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlgate.errors import Unavailable
from rlgate.store.base import Store, StoreError
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["RequestScope", "ScopedStore", "after_response", "begin_request", "current_scope", "end_request",
           "on_durable", "on_write_failure", "store_refusal", "undo_changes"]

log = logging.getLogger("rlgate.core")


@dataclass
class RequestScope:
    """One request's pending store writes, deferred work and undo steps."""

    writes: list[int] = field(default_factory=list)  # store sequence numbers not yet waited for
    after: list[Callable[[], None]] = field(default_factory=list)  # run once the response was sent
    durable: list[Callable[[], None]] = field(default_factory=list)  # run once its writes so far are durable
    undo: list[Callable[[], None]] = field(default_factory=list)  # run (last first) if a write failed

    async def wait_durable(self, store: Store) -> None:
        """Return once every write noted so far is durable (raises ``StoreError`` if one failed)."""
        writes, self.writes = self.writes, []
        if writes:
            await store.wait_durable(writes)
        self.run_durable()

    def run_durable(self) -> None:
        """Run the hooks :func:`on_durable` registered (the request's changes are kept)."""
        hooks, self.durable = self.durable, []
        for fn in hooks:
            try:
                fn()
            except Exception:  # a bookkeeping hook must not turn a durable change into an error
                log.exception("on-durable hook failed")


_SCOPE: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("rlgate_request_scope", default=None)


def current_scope() -> RequestScope | None:
    return _SCOPE.get()


def _note_write(seq: int) -> int:
    """Record a store write of the current request (``seq`` as ``Store.save_*`` returned it)."""
    scope = _SCOPE.get()
    if scope is not None and seq:
        scope.writes.append(seq)
    return seq


class ScopedStore:
    """The store as the session manager sees it: each write is recorded for the durability barrier.

    A write made during a request joins that request's scope, so its response (or its stream's final
    event) waits until the write is durable; a write outside a request (startup, the idle sweeper) is
    waited for by nobody. Recording is part of the write, so a new ``save_*`` call cannot forget it.
    """

    def __init__(self, store: Store) -> None:
        self.inner = store

    def save_session(self, session: Session) -> int:
        return _note_write(self.inner.save_session(session))

    def save_interaction(self, interaction: Interaction) -> int:
        return _note_write(self.inner.save_interaction(interaction))

    def save_meta(self, key: str, value: Any) -> int:
        return _note_write(self.inner.save_meta(key, value))

    def delete_session(self, session_id: str) -> int:
        return _note_write(self.inner.delete_session(session_id))

    def load(self) -> list[Session]:
        return self.inner.load()

    def load_meta(self) -> dict[str, Any]:
        return self.inner.load_meta()

    async def wait_durable(self, seqs: Sequence[int]) -> None:
        await self.inner.wait_durable(seqs)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


def after_response(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current request's response was sent (now, outside a request)."""
    scope = _SCOPE.get()
    if scope is None:
        fn()
    else:
        scope.after.append(fn)


def on_durable(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current request's writes are durable, before its answer (or a stream's
    final event) is sent; never if they fail (outside a request: at once). For bookkeeping that
    counts a change only if it is kept, visible by the time the client sees the answer."""
    scope = _SCOPE.get()
    if scope is None:
        fn()
    else:
        scope.durable.append(fn)


def on_write_failure(fn: Callable[[], None]) -> None:
    """Run ``fn`` if the store cannot write the current request's changes."""
    scope = _SCOPE.get()
    if scope is not None:
        scope.undo.append(fn)


def undo_changes() -> int:
    """Undo the current request's in-memory changes (its writes failed); return how many."""
    scope = _SCOPE.get()
    if scope is None:
        return 0
    undo, scope.undo = scope.undo, []
    for fn in reversed(undo):
        try:
            fn()
        except Exception:  # undo the rest whatever one of them does (logged)
            log.exception("undoing a change after a failed write failed")
    scope.after.clear()  # nothing deferred runs for a request whose changes were undone
    scope.durable.clear()
    return len(undo)


def store_refusal(exc: StoreError, where: str) -> Unavailable:
    """A write of the current request failed: undo its in-memory changes and return the 503 to answer.

    The one place the store failure becomes an answer (``store_unavailable``), whoever sees it: the
    error handler (a write refused at submission), the durability middleware (before a response's
    head), ``GenerationService.run`` (before a stream's final event)."""
    undone = undo_changes()
    log.error("%s: the store failed (%s); %d in-memory changes undone", where, exc, undone)
    return Unavailable(str(exc), code="store_unavailable")


def begin_request() -> tuple[RequestScope, contextvars.Token[RequestScope | None]]:
    """Open a scope; returns it and the token :func:`end_request` takes."""
    scope = RequestScope()
    return scope, _SCOPE.set(scope)


def end_request(token: contextvars.Token[RequestScope | None]) -> None:
    _SCOPE.reset(token)
