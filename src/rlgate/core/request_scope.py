"""What one request leaves to do around its response: wait for its writes, run deferred work,
undo its in-memory changes if its writes failed.

The ASGI layer opens a :class:`RequestScope` per request (:func:`begin_request` /
:func:`end_request`); code below it does not know about HTTP:

* :func:`note_write` records the sequence number a ``Store.save_*`` call returned; before a
  response (or a stream's final event) reports a change, :meth:`RequestScope.wait_durable`
  awaits exactly the writes the request made so far (``Store.wait_durable``);
* :func:`after_response`: run once the response was sent (outside a request: at once);
* :func:`on_write_failure`: undo an in-memory change if the store fails to write the
  request's changes (outside a request: never). Whoever sees the request's
  :class:`~rlgate.store.base.StoreError` calls :func:`undo_changes`, so that a change the
  client was refused (503) leaves nothing in memory a later request could land on.

Outside a request (startup, the idle sweeper) there is no scope: writes are not waited
for, and deferred work runs at once. The current scope is found through a context
variable, so tasks a request starts (a streamed body) share it.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from rlgate.store.base import Store

__all__ = ["RequestScope", "after_response", "begin_request", "current_scope", "end_request", "note_write",
           "on_write_failure", "undo_changes"]

log = logging.getLogger("rlgate.core")


@dataclass
class RequestScope:
    """One request's pending store writes, deferred work and undo steps."""

    writes: list[int] = field(default_factory=list)  # store sequence numbers not yet waited for
    after: list[Callable[[], None]] = field(default_factory=list)  # run once the response was sent
    undo: list[Callable[[], None]] = field(default_factory=list)  # run (last first) if a write failed

    async def wait_durable(self, store: Store) -> None:
        """Return once every write noted so far is durable (raises ``StoreError`` if one failed)."""
        writes, self.writes = self.writes, []
        if writes:
            await store.wait_durable(writes)


_SCOPE: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("rlgate_request_scope", default=None)


def current_scope() -> RequestScope | None:
    return _SCOPE.get()


def note_write(seq: int) -> None:
    """Record a store write of the current request (``seq`` as ``Store.save_*`` returned it)."""
    scope = _SCOPE.get()
    if scope is not None and seq:
        scope.writes.append(seq)


def after_response(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current request's response was sent (now, outside a request)."""
    scope = _SCOPE.get()
    if scope is None:
        fn()
    else:
        scope.after.append(fn)


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
    return len(undo)


def begin_request() -> tuple[RequestScope, contextvars.Token[RequestScope | None]]:
    """Open a scope; returns it and the token :func:`end_request` takes."""
    scope = RequestScope()
    return scope, _SCOPE.set(scope)


def end_request(token: contextvars.Token[RequestScope | None]) -> None:
    _SCOPE.reset(token)
