"""Work deferred until the current HTTP response has been sent.

The ASGI layer opens a scope per request (:func:`begin_request` / :func:`end_request`);
code below it calls :func:`after_response` without knowing about HTTP. Outside a request
the work runs at once.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

_AFTER_RESPONSE: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar(
    "rlgate_after_response", default=None
)


def after_response(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current request's response was sent (now, outside a request)."""
    hooks = _AFTER_RESPONSE.get()
    if hooks is None:
        fn()
    else:
        hooks.append(fn)


def begin_request() -> tuple[list[Callable[[], None]], contextvars.Token[list[Callable[[], None]] | None]]:
    """Open a scope; returns its hook list (run them once the response is sent) and a reset token."""
    hooks: list[Callable[[], None]] = []
    return hooks, _AFTER_RESPONSE.set(hooks)


def end_request(token: contextvars.Token[list[Callable[[], None]] | None]) -> None:
    _AFTER_RESPONSE.reset(token)
