"""Column values: token ids, logprobs and versions as little-endian arrays; JSON; text.

* token ids and weight versions: int32 little-endian bytes; logprobs: float64
  little-endian bytes (bit-exact round trip). 4 bytes per token instead of ~6 in JSON,
  and ~20x faster to encode than ``json.dumps`` (see benchmarks/load.py --measure-encoding).
* messages, tools, output message, sampling, metadata: JSON (OpenAI chat form,
  ``message_to_openai``) by :mod:`rlgate.json_text`: UTF-8, and ASCII-escaped where it
  must be so that any string round-trips (lone surrogates).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

from rlgate.chat.conversation import Message, ToolSpec, message_to_openai
from rlgate.json_text import dumps_text
from rlgate.store.base import StoreError

__all__ = [
    "decode_floats",
    "decode_ints",
    "encode_floats",
    "encode_ints",
    "key_text",
    "messages_json",
    "text",
    "to_json",
    "tools_json",
]

_LITTLE = sys.byteorder == "little"


def encode_ints(xs: list[int]) -> bytes:
    a = array("i", xs)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        a.byteswap()
    return a.tobytes()


def decode_ints(b: bytes) -> list[int]:
    a = array("i")
    a.frombytes(b)
    if not _LITTLE:  # pragma: no cover
        a.byteswap()
    return a.tolist()


def encode_floats(xs: list[float]) -> bytes:
    a = array("d", xs)
    if not _LITTLE:  # pragma: no cover
        a.byteswap()
    return a.tobytes()


def decode_floats(b: bytes) -> list[float]:
    a = array("d")
    a.frombytes(b)
    if not _LITTLE:  # pragma: no cover
        a.byteswap()
    return a.tolist()


def to_json(obj: Any) -> str:
    # a value with a lone surrogate (or any other odd string) is ASCII-escaped: it survives the round trip
    return dumps_text(obj, ascii_fallback=True)


def messages_json(msgs: list[Message]) -> str:
    return to_json([message_to_openai(m) for m in msgs])


def tools_json(tools: list[ToolSpec]) -> str:
    return to_json([{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools])


def text(s: str | None) -> str | None:
    """A TEXT value SQLite can take (free-form text, e.g. error messages)."""
    if s is None:
        return None
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def key_text(s: str, what: str) -> str:
    """Identifiers must round-trip exactly: refuse what SQLite cannot store (lone surrogates)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StoreError(f"{what} {s!r} is not valid Unicode and cannot be stored") from exc
    return s
