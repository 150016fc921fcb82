"""Errors after a stream has started: one path for every surface.

A streamed response has sent its status line by the time generation can fail, so a
failure is reported in-band, in the surface's own format, and then the stream ends (no
``[DONE]``, no final event). :func:`guard_stream` wraps a surface's frame generator: an
rlgate :class:`~rlgate.errors.GatewayError` (an engine failure, the store, a session ended
meanwhile) is reported as it is; any other exception is a bug or a third party's failure:
it is logged with its traceback and reported as a generic internal error, so no exception
text or type reaches the client. Recording the interaction as failed is the
:class:`~rlgate.core.generation.GenerationService`'s job, the same for every surface.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterable

from rlgate.errors import GatewayError, InternalError

__all__ = ["guard_stream"]

log = logging.getLogger("rlgate.api")


async def guard_stream(
    frames: AsyncGenerator[bytes, None],
    error_frames: Callable[[GatewayError], Iterable[bytes]],
    *,
    label: str,
) -> AsyncGenerator[bytes, None]:
    """Yield ``frames``; if they fail, yield ``error_frames(error)`` and end the stream.

    Cancellation (a client that went away) is not an error: it propagates untouched, and
    ``frames`` is closed either way.
    """
    async with contextlib.aclosing(frames):
        try:
            async for frame in frames:
                yield frame
        except GatewayError as exc:
            for frame in error_frames(exc):
                yield frame
        except Exception:  # a bug or a third party's failure: logged here, never sent
            log.exception("%s failed after the response started", label)
            for frame in error_frames(InternalError()):
                yield frame
