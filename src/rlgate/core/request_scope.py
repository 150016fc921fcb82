"""What one request leaves to do around its response: wait for its writes, run deferred work.

The ASGI layer opens a :class:`RequestScope` per request (:func:`begin_request` /
:func:`end_request`); code below it does not know about HTTP:

* :func:`note_write` records the sequence number a ``Store.save_*`` call returned; before a
  response (or a stream's final event) reports a change, :meth:`RequestScope.wait_durable`
  awaits exactly the writes the request made so far (``Store.wait_durable``);
* :func:`after_response` defers work until the response has been sent.

Outside a request (startup, the idle sweeper) there is no scope: writes are not waited
for, and deferred work runs at once. The current scope is found through a context
variable, so tasks a request starts (a streamed body) share it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field

from rlgate.store.base import Store

__all__ = ["RequestScope", "after_response", "begin_request", "current_scope", "end_request", "note_write"]


@dataclass
class RequestScope:
    """One request's pending store writes and deferred work."""

    writes: list[int] = field(default_factory=list)  # store sequence numbers not yet waited for
    hooks: list[Callable[[], None]] = field(default_factory=list)  # run once the response was sent

    async def wait_durable(self, store: Store) -> None:
        """Return once every write noted so far is durable (raises ``StoreError`` if one failed)."""
        writes, self.writes = self.writes, []
        if writes:
            await store.wait_durable(writes)


_CURRENT: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("rlgate_request_scope", default=None)


def current_scope() -> RequestScope | None:
    return _CURRENT.get()


def note_write(seq: int) -> None:
    """Record a store write of the current request (``seq`` as ``Store.save_*`` returned it)."""
    scope = _CURRENT.get()
    if scope is not None and seq:
        scope.writes.append(seq)


def after_response(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current request's response was sent (now, outside a request)."""
    scope = _CURRENT.get()
    if scope is None:
        fn()
    else:
        scope.hooks.append(fn)


def begin_request() -> tuple[RequestScope, contextvars.Token[RequestScope | None]]:
    """Open a scope; returns it and the token :func:`end_request` takes."""
    scope = RequestScope()
    return scope, _CURRENT.set(scope)


def end_request(token: contextvars.Token[RequestScope | None]) -> None:
    _CURRENT.reset(token)
