"""The SQLite schema (version 1) and the statements that write it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rlgate.store.base import StoreError

__all__ = [
    "DYNAMIC_COLS",
    "INSERT_INTERACTION",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SESSION_COLS",
    "STATIC_COLS",
    "UPDATE_INTERACTION",
    "UPSERT_SESSION",
    "init_db",
]

SCHEMA_VERSION = 5  # 2: interactions.client_store; 3: tenants, feedback (rlgate serve --online); 4: policy;
# 5: interactions.template_dropped

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL                  -- JSON
);
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,        -- "{task_id}-{k}"
    task_id     TEXT NOT NULL,
    key_hash    TEXT NOT NULL,           -- sha256 hex of the session key; the key itself is never stored
    mode        TEXT NOT NULL,           -- token_exact | rerender
    status      TEXT NOT NULL,           -- active | ended | interrupted
    created_at  REAL NOT NULL,
    last_active REAL NOT NULL,
    ended_at    REAL,
    exported_at REAL,                    -- retained for audit after export (--retain-exported)
    metadata    TEXT NOT NULL,           -- JSON object
    policy      TEXT                     -- the policy it is bound to (NULL: unbound)
);
CREATE TABLE IF NOT EXISTS interactions (
    id              TEXT PRIMARY KEY,    -- API response id (chatcmpl-..., resp_..., msg_...)
    seq             INTEGER NOT NULL,    -- order of first write = order in the session (exports keep it)
    session_id      TEXT NOT NULL,
    api             TEXT NOT NULL,
    parent_id       TEXT,
    relation        TEXT NOT NULL,       -- root | extend | fork
    fork_reason     TEXT,
    context_key     TEXT NOT NULL,
    prefix_key      TEXT NOT NULL,
    base_id         TEXT,                -- delta encoding: the interaction the fields below extend
    prompt_base_len INTEGER NOT NULL,    -- leading prompt ids taken from base's prompt_ids + output_ids
    prompt_ids      BLOB NOT NULL,       -- int32 LE: the remaining prompt ids
    messages_skip   INTEGER NOT NULL,    -- leading messages equal to base's
    messages        TEXT NOT NULL,       -- JSON list (OpenAI chat form): the remaining messages
    tools           TEXT,                -- JSON list; NULL: same as base's
    sampling        TEXT NOT NULL,       -- JSON object
    client_store    INTEGER NOT NULL DEFAULT 1,  -- 0: the client sent store=false (not referenceable)
    status          TEXT NOT NULL,       -- pending | completed | failed
    output_ids      BLOB NOT NULL,       -- int32 LE
    output_logprobs BLOB NOT NULL,       -- float64 LE
    output_versions BLOB NOT NULL,       -- int32 LE
    finish_reason   TEXT,
    stop_kind       TEXT,
    output_message  TEXT,                -- JSON (OpenAI chat form)
    reward          REAL,
    error           TEXT,
    created_at      REAL NOT NULL,
    completed_at    REAL,
    policy          TEXT,                -- the policy that served it (NULL: recorded before policies)
    template_dropped TEXT                -- JSON list of what the chat template left out (NULL: nothing / before 5)
);
CREATE INDEX IF NOT EXISTS interactions_by_session ON interactions (session_id);
CREATE TABLE IF NOT EXISTS tenants (     -- rlgate serve --online (store/sqlite/online.py)
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    key_hash    TEXT NOT NULL,           -- sha256 hex of the tenant key; the key itself is never stored
    created_at  REAL NOT NULL,
    revoked_at  REAL
);
CREATE TABLE IF NOT EXISTS feedback (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,  -- the listing cursor (never reused)
    id              TEXT NOT NULL UNIQUE,
    tenant          TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    interaction_id  TEXT,                -- NULL: about the whole conversation
    kind            TEXT NOT NULL,       -- thumbs | rating | preference | comment | outcome | implicit
    value           TEXT NOT NULL,       -- JSON number or string
    source          TEXT NOT NULL,       -- explicit | implicit | delayed
    created_at      REAL NOT NULL,
    policy_version  INTEGER,
    metadata        TEXT NOT NULL        -- JSON object
);
CREATE INDEX IF NOT EXISTS feedback_by_conversation ON feedback (tenant, conversation_id);
CREATE INDEX IF NOT EXISTS feedback_by_time ON feedback (created_at);
"""

SESSION_COLS = ("id", "task_id", "key_hash", "mode", "status", "created_at", "last_active", "ended_at",
                 "exported_at", "metadata", "policy")
STATIC_COLS = ("id", "seq", "session_id", "api", "parent_id", "relation", "fork_reason", "context_key", "base_id",
                "prompt_base_len", "prompt_ids", "messages_skip", "messages", "tools", "sampling",
                "client_store", "created_at", "policy", "template_dropped")
DYNAMIC_COLS = ("prefix_key", "status", "output_ids", "output_logprobs", "output_versions", "finish_reason",
                 "stop_kind", "output_message", "reward", "error", "completed_at")

UPSERT_SESSION = (
    f"INSERT INTO sessions ({', '.join(SESSION_COLS)}) VALUES ({', '.join('?' * len(SESSION_COLS))}) "
    f"ON CONFLICT(id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in SESSION_COLS[1:])}"
)
INSERT_INTERACTION = (
    f"INSERT OR REPLACE INTO interactions ({', '.join(STATIC_COLS + DYNAMIC_COLS)}) "
    f"VALUES ({', '.join('?' * (len(STATIC_COLS) + len(DYNAMIC_COLS)))})"
)
UPDATE_INTERACTION = f"UPDATE interactions SET {', '.join(f'{c}=?' for c in DYNAMIC_COLS)} WHERE id=?"


def init_db(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables (if new) and set the pragmas the write path relies on."""
    c = conn
    version = c.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(f"store {path} has schema version {version}; this rlgate reads up to "
                         f"{SCHEMA_VERSION} (upgrade rlgate)")
    c.execute("PRAGMA journal_mode=WAL")
    # Commits only write to the WAL (no fsync on the event loop); the sync thread fsyncs the
    # WAL ("full") and checkpoints it into the database file, off the event loop.
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    c.execute(f"PRAGMA journal_size_limit={16 * 1024 * 1024}")  # WAL truncated to this when it restarts
    c.execute("PRAGMA busy_timeout=5000")
    # Deleted rows are overwritten with zeros, not left in free pages: a deletion on request
    # (rlgate serve --online, docs/online.md "Data rights") leaves no readable copy in the file.
    c.execute("PRAGMA secure_delete=ON")
    c.executescript(SCHEMA)
    if 0 < version < 2:  # a version-1 store: add the column (its rows were all stored)
        c.execute("ALTER TABLE interactions ADD COLUMN client_store INTEGER NOT NULL DEFAULT 1")
    if 0 < version < 4:  # before policies: every session unbound, every turn of the default policy (NULL)
        c.execute("ALTER TABLE sessions ADD COLUMN policy TEXT")
        c.execute("ALTER TABLE interactions ADD COLUMN policy TEXT")
    if 0 < version < 5:  # before the template drops were stored: restored turns show none
        c.execute("ALTER TABLE interactions ADD COLUMN template_dropped TEXT")
    c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
