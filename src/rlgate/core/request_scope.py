"""Work tied to the outcome of the current HTTP request.

The ASGI layer opens a scope per request (:func:`begin_request` / :func:`end_request`);
code below it registers work without knowing about HTTP:

* :func:`after_response`: run once the response was sent (outside a request: at once);
* :func:`on_write_failure`: undo an in-memory change if the store fails to write the
  request's changes (outside a request: never). Whoever sees the request's
  :class:`~rlgate.store.base.StoreError` calls :func:`undo_changes`, so that a change the
  client was refused (503) leaves nothing in memory a later request could land on.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("rlgate.core")


@dataclass
class RequestScope:
    after: list[Callable[[], None]] = field(default_factory=list)  # run once the response was sent
    undo: list[Callable[[], None]] = field(default_factory=list)  # run (last first) if a write failed


_SCOPE: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("rlgate_request_scope", default=None)


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
        except Exception:  # noqa: BLE001 - undo the rest whatever one of them does
            log.exception("undoing a change after a failed write failed")
    scope.after.clear()  # nothing deferred runs for a request whose changes were undone
    return len(undo)


def begin_request() -> tuple[RequestScope, contextvars.Token[RequestScope | None]]:
    """Open a scope; returns it and a reset token."""
    scope = RequestScope()
    return scope, _SCOPE.set(scope)


def end_request(token: contextvars.Token[RequestScope | None]) -> None:
    _SCOPE.reset(token)
