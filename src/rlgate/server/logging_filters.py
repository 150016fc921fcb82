"""Log filters installed by ``serve``: a log that never floods, and no query strings.

**Repeats.** With its open-file limit reached the gateway wrote 255,136 "Too many open
files" lines in a minute (issue 15). :class:`RepeatFilter`, installed on the log handlers by
``serve``, lets through at most ``burst`` warnings or errors with the same origin (logger,
level, message template) per ``window`` seconds; the first record let through after a
suppression says how many were dropped. Records below WARNING are never held back: the
access log (one line per request), "session ... started", per-turn debug lines share one
template each, and throttling them by template dropped all but 10 a minute. The table of
origins is bounded.

**Query strings.** rlgate reads keys only from headers, but a client may still put one in
the URL (``?api_key=...``); uvicorn's access log would print it. :class:`RedactQueryFilter`
replaces the query string of every access-log line with ``?<redacted>``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_ORIGINS = 4096


@dataclass
class _Origin:
    window_start: float
    count: int = 0
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    def __init__(self, burst: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self.clock = clock
        self._origins: dict[tuple[str, int, str], _Origin] = {}
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        origin = self._origins.get(key)
        if origin is None:
            if len(self._origins) >= MAX_ORIGINS:
                self._origins.clear()
            origin = self._origins[key] = _Origin(now)
        if now - origin.window_start >= self.window:
            origin.window_start, origin.count = now, 0
        origin.count += 1
        if origin.count > self.burst:
            origin.suppressed += 1
            self.suppressed += 1
            return False
        if origin.suppressed:
            record.msg = f"{record.msg} [{origin.suppressed} more like this suppressed]"
            origin.suppressed = 0
        return True


class RedactQueryFilter(logging.Filter):
    """Drop query strings from uvicorn access-log records (args: client, method, path, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?<redacted>", *args[3:])
        return True


def install(filter_: logging.Filter, logger_names: tuple[str, ...] = ("", "uvicorn", "uvicorn.error",
                                                                      "uvicorn.access")) -> None:
    """Attach ``filter_`` to every handler of these loggers (filters on handlers see propagated records)."""
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if filter_ not in handler.filters:
                handler.addFilter(filter_)
