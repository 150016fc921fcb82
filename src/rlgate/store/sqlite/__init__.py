"""The durable store: SQLite (stdlib ``sqlite3``) in WAL mode.

``store`` holds :class:`SQLiteStore`; ``commits`` the write path (group commit on the
event loop, fsync and checkpoints on a thread, the durability barrier); ``rows`` the delta
encoding of interactions along a conversation; ``codec`` column values; ``schema`` the
tables; ``files`` the lock and file permissions.
"""

from __future__ import annotations

from rlgate.store.sqlite.codec import decode_floats, decode_ints, encode_floats, encode_ints
from rlgate.store.sqlite.files import StoreLocked
from rlgate.store.sqlite.schema import SCHEMA_VERSION
from rlgate.store.sqlite.store import SQLiteStore

__all__ = [
    "SCHEMA_VERSION",
    "SQLiteStore",
    "StoreLocked",
    "decode_floats",
    "decode_ints",
    "encode_floats",
    "encode_ints",
]
