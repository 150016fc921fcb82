"""JSON text on the hot path: responses, SSE frames, stored interaction rows, render-cache keys.

``orjson`` (C; ~10x faster than the standard library on these values: issue 14 measured 6%
of a generation's CPU saved) where it can, the standard library for what it refuses: lone
surrogates in strings, integers beyond 64 bits, keys that are not strings, types it does
not know. A value ``orjson`` refuses thus encodes exactly as it did before, or fails the
same way. The output is compact and UTF-8 (not ASCII-escaped); JSON readers get the same
values either way.

One difference: ``orjson`` writes NaN and ±Infinity as ``null``, where the standard library
writes non-standard literals (or raises). rlgate refuses non-finite numbers in request
bodies (``api/common.py: read_json``), so the values encoded here do not hold them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["canonical", "dumps", "dumps_text"]


def dumps(obj: Any, *, ascii_fallback: bool = False, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact JSON as UTF-8 bytes. ``ascii_fallback``: a value ``orjson`` refuses is written
    ASCII-escaped, so that a lone surrogate survives (the store); else it must encode as UTF-8
    (a response: a lone surrogate raises, as it did)."""
    try:
        return orjson.dumps(obj, default=default)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        text = json.dumps(obj, ensure_ascii=ascii_fallback, separators=(",", ":"), default=default)
        return text.encode("utf-8")


def dumps_text(obj: Any, *, ascii_fallback: bool = False) -> str:
    """:func:`dumps` as a ``str``."""
    return dumps(obj, ascii_fallback=ascii_fallback).decode("utf-8")


def canonical(obj: Any) -> bytes:
    """Compact JSON with sorted keys, as UTF-8 bytes, for digests: equal values (whatever their
    key order) give equal bytes, within one process. ``orjson`` where it can (a 46 KB tool list:
    0.03 ms instead of the standard library's 0.42 ms, on every request that sends tools); the
    standard library for what it refuses (lone surrogates kept with ``surrogatepass``)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8", "surrogatepass")
