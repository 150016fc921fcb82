"""A durable store: SQLite (stdlib ``sqlite3``) in WAL mode.

Writes and the event loop
-------------------------
``save_*`` / ``delete_session`` serialise the change (a snapshot of plain values) and
append it to a pending list. At the end of the event-loop iteration everything pending is
committed in one transaction on the event-loop thread (group commit); ``wait_durable()``
commits at once instead of waiting for the end of the iteration. The connection runs with
``synchronous=NORMAL`` and without automatic checkpoints, so a commit only appends to the
WAL file (page cache: microseconds) and never waits for the disk. A background thread does
what does wait for the disk: in ``"full"`` mode it fsyncs the WAL after commits (one fsync
covers every commit made while the previous one ran) and it checkpoints the WAL into the
database file once it exceeds 4 MiB.

Why not a writer thread: it was measured (benchmarks/load.py, gateway CPU per request).
Handing every write to a thread makes the event loop and the writer trade the GIL several
times per write: +0.9 to +1.1 ms per request (+40 %) in either sync mode. Committing on
the loop costs +0.35 ms in "normal" mode; "full" mode still pays about +0.9 ms, for the
fsync itself and the hand-offs to and from the sync thread (one per group of commits).

:meth:`SQLiteStore.wait_durable` is the barrier the gateway awaits before it sends a
response that reports a change, so that "the client saw it" implies "it is durable"
(docs/operations.md, "Durability guarantee"). A failed transaction is retried one write at
a time, so one bad write cannot sink the others; only requests whose writes failed get
:class:`StoreError`.

Encoding (schema version 1)
---------------------------
* token ids and weight versions: int32 little-endian bytes; logprobs: float64
  little-endian bytes (bit-exact round trip). 4 bytes per token instead of ~6 in JSON,
  and ~20x faster to encode than ``json.dumps`` (see benchmarks/load.py --measure-encoding).
* messages, tools, output message: JSON (OpenAI chat form, ``message_to_openai``),
  ASCII-escaped so any string round-trips.
* delta encoding along the conversation: a turn that extends its parent stores only what
  it adds. ``base_id`` names the parent; ``prompt_base_len`` leading prompt ids are the
  parent's ``prompt_ids + output_ids`` (or its prompt only), ``messages_skip`` leading
  messages equal the parent's, and ``tools`` is NULL when they equal the parent's. A
  50-turn conversation thus stores O(turns) tokens and messages, not O(turns^2).
* keys: only ``key_hash`` (SHA-256 of the session key) exists on a session; keys are never
  written anywhere.

The file (and SQLite's ``-wal`` / ``-shm`` files, which inherit its mode) is created 0600
in a 0700 directory. A ``.lock`` file next to it holds an exclusive ``flock`` while the
store is open: a second gateway on the same file refuses to start.
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import json
import logging
import os
import sqlite3
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from rlgate.chat.conversation import Message, ToolSpec, message_from_openai, message_to_openai
from rlgate.store.base import StoreError
from rlgate.trajectory.interaction import Interaction, Session

log = logging.getLogger("rlgate.store")

SCHEMA_VERSION = 2  # 2: interactions.client_store

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
    metadata    TEXT NOT NULL            -- JSON object
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
    completed_at    REAL
);
CREATE INDEX IF NOT EXISTS interactions_by_session ON interactions (session_id);
"""

_SESSION_COLS = ("id", "task_id", "key_hash", "mode", "status", "created_at", "last_active", "ended_at",
                 "exported_at", "metadata")
_STATIC_COLS = ("id", "seq", "session_id", "api", "parent_id", "relation", "fork_reason", "context_key", "base_id",
                "prompt_base_len", "prompt_ids", "messages_skip", "messages", "tools", "sampling", "client_store", "created_at")
_DYNAMIC_COLS = ("prefix_key", "status", "output_ids", "output_logprobs", "output_versions", "finish_reason",
                 "stop_kind", "output_message", "reward", "error", "completed_at")

_UPSERT_SESSION = (
    f"INSERT INTO sessions ({', '.join(_SESSION_COLS)}) VALUES ({', '.join('?' * len(_SESSION_COLS))}) "
    f"ON CONFLICT(id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in _SESSION_COLS[1:])}"
)
_INSERT_INTERACTION = (
    f"INSERT OR REPLACE INTO interactions ({', '.join(_STATIC_COLS + _DYNAMIC_COLS)}) "
    f"VALUES ({', '.join('?' * (len(_STATIC_COLS) + len(_DYNAMIC_COLS)))})"
)
_UPDATE_INTERACTION = f"UPDATE interactions SET {', '.join(f'{c}=?' for c in _DYNAMIC_COLS)} WHERE id=?"

_LITTLE = sys.byteorder == "little"

# Writes submitted by the current request (its task's context), per store:
# {id(store): [last seq before them, last seq]}. wait_durable() waits for exactly those, and
# reports a failure only if one of them failed.
_REQUEST_WRITES: contextvars.ContextVar[dict[int, list[int]] | None] = contextvars.ContextVar(
    "rlgate_store_writes", default=None)


# --------------------------------------------------------------------------- encoding


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


def _json(obj: Any) -> str:
    # ASCII-escaped: lone surrogates and any other odd string survive the round trip
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=True)


def _messages_json(msgs: list[Message]) -> str:
    return _json([message_to_openai(m) for m in msgs])


def _tools_json(tools: list[ToolSpec]) -> str:
    return _json([{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools])


def _text(s: str | None) -> str | None:
    """A TEXT value SQLite can take (free-form text, e.g. error messages)."""
    if s is None:
        return None
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _key_text(s: str, what: str) -> str:
    """Identifiers must round-trip exactly: refuse what SQLite cannot store (lone surrogates)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StoreError(f"{what} {s!r} is not valid Unicode and cannot be stored") from exc
    return s


def _common_prefix_len(a: list[Message], b: list[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --------------------------------------------------------------------------- store


class StoreLocked(StoreError):
    """Another process has the store open."""


class SQLiteStore:
    """SQLite store (see the module docstring). ``synchronous``: ``"full"``: a change is
    durable once the WAL holding it is fsynced (survives power loss); ``"normal"``: once it
    is committed to the WAL (survives a crash of the gateway process, not of the machine)."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "full") -> None:
        if synchronous not in ("full", "normal"):
            raise ValueError("synchronous must be 'full' or 'normal'")
        self.path = Path(path)
        self.synchronous = synchronous
        self._lock_fd = self._open_files()
        try:
            self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self._init_db()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._db_lock = threading.Lock()  # the write connection: event loop, close(), load()
        # Writes wait in _pending until the end of the current event-loop iteration, then all of
        # them are committed in one transaction (group commit); wait_durable() commits at once.
        self._pending: list[tuple[int, list[tuple[str, tuple[Any, ...]]]]] = []
        self._pending_lock = threading.Lock()
        self._commit_loop: asyncio.AbstractEventLoop | None = None  # loop with a commit scheduled
        self._state = threading.Condition()
        self._submitted = 0  # seq of the last write submitted
        self._committed = 0  # seq up to which every write was committed (or failed)
        self._durable = 0  # seq up to which commits are durable (fsynced in "full" mode)
        self._failures: list[tuple[int, str]] = []  # (seq, error) of writes that failed
        self._waiters: list[tuple[int, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed = False
        # delta encoding: the live interactions (references, no copies) and which rows exist
        self._live: dict[str, Interaction] = {}
        self._by_session: dict[str, set[str]] = {}
        self._inserted: set[str] = set()
        self._seq = 0  # last interaction seq handed out
        self.stats = {"commits": 0, "writes": 0, "failed_writes": 0, "fsyncs": 0, "checkpoints": 0}
        self._syncer = threading.Thread(target=self._sync_forever, name="rlgate-store-sync", daemon=True)
        self._syncer.start()

    # ------------------------------------------------------------------ files

    def _open_files(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StoreLocked(f"store {self.path} is in use by another rlgate process") from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        # SQLite creates -wal / -shm with the database file's mode: make it 0600 first.
        created = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(created)
        for p in (self.path, self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")):
            if p.exists() and (p.stat().st_mode & 0o077):
                log.warning("store file %s was readable by others: setting mode 0600", p)
                os.chmod(p, 0o600)
        return fd

    def _init_db(self) -> None:
        c = self._conn
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"store {self.path} has schema version {version}; this rlgate reads up to "
                             f"{SCHEMA_VERSION} (upgrade rlgate)")
        c.execute("PRAGMA journal_mode=WAL")
        # Commits only write to the WAL (no fsync on the event loop); the sync thread fsyncs the
        # WAL ("full") and checkpoints it into the database file, off the event loop.
        c.execute("PRAGMA synchronous=NORMAL")
        c.execute("PRAGMA wal_autocheckpoint=0")
        c.execute(f"PRAGMA journal_size_limit={16 * 1024 * 1024}")  # WAL truncated to this when it restarts
        c.execute("PRAGMA busy_timeout=5000")
        c.executescript(SCHEMA)
        if 0 < version < 2:  # a version-1 store: add the column (existing rows were all stored)
            c.execute("ALTER TABLE interactions ADD COLUMN client_store INTEGER NOT NULL DEFAULT 1")
        c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # ------------------------------------------------------------------ load (startup)

    def load_meta(self) -> dict[str, Any]:
        with self._db_lock:
            rows = self._conn.execute("SELECT key, value FROM meta").fetchall()
        return {k: json.loads(v) for k, v in rows}

    def load(self) -> list[Session]:
        with self._db_lock:
            srows = self._conn.execute(
                f"SELECT {', '.join(_SESSION_COLS)} FROM sessions ORDER BY created_at, rowid").fetchall()
            irows = self._conn.execute(
                f"SELECT {', '.join(_STATIC_COLS + _DYNAMIC_COLS)} FROM interactions ORDER BY seq").fetchall()
        sessions: dict[str, Session] = {}
        for row in srows:
            r = dict(zip(_SESSION_COLS, row, strict=False))
            s = Session(id=r["id"], task_id=r["task_id"], key_hash=r["key_hash"], mode=r["mode"],
                        status=r["status"], created_at=r["created_at"], last_active=r["last_active"],
                        ended_at=r["ended_at"], exported_at=r["exported_at"], metadata=json.loads(r["metadata"]))
            sessions[s.id] = s
        decoded: dict[str, Interaction] = {}
        all_rows = [dict(zip(_STATIC_COLS + _DYNAMIC_COLS, row, strict=False)) for row in irows]
        known = {r["id"] for r in all_rows}
        rows = all_rows
        while rows:  # seq order puts a base before its extensions; loop in case it does not
            deferred = [r for r in rows if r["base_id"] in known and r["base_id"] not in decoded]
            for r in rows:
                if not (r["base_id"] in known and r["base_id"] not in decoded):
                    i = self._decode(r, sessions, decoded)
                    if i is not None:
                        decoded[i.id] = i
            if len(deferred) == len(rows):  # cannot happen (bases are older); never spin
                for r in deferred:
                    log.error("store: interaction %s extends undecodable %s; skipped", r["id"], r["base_id"])
                break
            rows = [r for r in deferred if r["id"] not in decoded]
        for r in all_rows:  # seq order: the order the live session had them in
            self._seq = max(self._seq, r["seq"])
            i = decoded.get(r["id"])
            if i is not None:
                sessions[i.session_id].interactions[i.id] = i
                self._track(i)
                self._inserted.add(i.id)
        return list(sessions.values())

    def _decode(self, r: dict[str, Any], sessions: dict[str, Session],
                decoded: dict[str, Interaction]) -> Interaction | None:
        if r["session_id"] not in sessions:
            log.error("store: interaction %s belongs to no session; skipped", r["id"])
            return None
        base = decoded.get(r["base_id"]) if r["base_id"] else None
        if r["base_id"] and base is None:
            log.error("store: interaction %s extends missing %s; skipped", r["id"], r["base_id"])
            return None
        prompt = decode_ints(r["prompt_ids"])
        messages = [message_from_openai(m) for m in json.loads(r["messages"])]
        if base is not None:
            prompt = (base.prompt_ids + base.output_ids)[: r["prompt_base_len"]] + prompt
            messages = base.messages[: r["messages_skip"]] + messages
        tools = base.tools if (r["tools"] is None and base is not None) else [
            ToolSpec(name=t["name"], description=t.get("description"), parameters=t["parameters"])
            for t in json.loads(r["tools"] or "[]")
        ]
        out_msg = message_from_openai(json.loads(r["output_message"])) if r["output_message"] else None
        return Interaction(
            id=r["id"], session_id=r["session_id"], api=r["api"], messages=messages, tools=tools,
            prompt_ids=prompt, parent_id=r["parent_id"], relation=r["relation"], fork_reason=r["fork_reason"],
            context_key=r["context_key"], prefix_key=r["prefix_key"],
            output_ids=decode_ints(r["output_ids"]), output_logprobs=decode_floats(r["output_logprobs"]),
            output_versions=decode_ints(r["output_versions"]), finish_reason=r["finish_reason"],
            stop_kind=r["stop_kind"], output_message=out_msg, reward=r["reward"], status=r["status"],
            error=r["error"], created_at=r["created_at"], completed_at=r["completed_at"],
            sampling=json.loads(r["sampling"]), client_store=bool(r["client_store"]),
        )

    # ------------------------------------------------------------------ writes (event loop side)

    def _submit(self, ops: list[tuple[str, tuple[Any, ...]]]) -> None:
        if self._closed:
            log.error("store closed: dropping a write (%s)", ops[0][0].split(" (")[0])
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._pending_lock:
            self._submitted += 1
            seq = self._submitted
            self._pending.append((seq, ops))
            schedule = loop is not None and self._commit_loop is None
            if schedule:
                self._commit_loop = loop
            # no loop, or another loop scheduled the commit: do not depend on it running
            now = not schedule and (loop is None or self._commit_loop is not loop)
        writes = _REQUEST_WRITES.get()
        if writes is None:
            writes = {}
            _REQUEST_WRITES.set(writes)
        mine = writes.get(id(self))
        if mine is None:
            writes[id(self)] = [seq - 1, seq]
        else:
            mine[1] = seq
        if schedule:  # one transaction for everything submitted during this loop iteration
            loop.call_soon(self._commit_pending)  # type: ignore[union-attr]
        elif now:
            self._commit_pending()

    def _commit_pending(self) -> None:
        """Commit everything submitted so far, in one transaction (on the calling thread)."""
        with self._pending_lock:
            jobs, self._pending = self._pending, []
            self._commit_loop = None
            if not jobs:
                return
            with self._db_lock:  # still under _pending_lock: transactions commit in seq order
                failed = self._write(jobs)
        upto = jobs[-1][0]
        with self._state:
            self._committed = upto
            if failed:
                self._failures = (self._failures + failed)[-1000:]
            if self.synchronous == "normal":  # written to the OS: survives the process
                self._durable = upto
            else:
                self._state.notify_all()  # the sync thread fsyncs it
        if self.synchronous == "normal" and self._waiters:
            self._wake_waiters()

    def _track(self, i: Interaction) -> None:
        self._live[i.id] = i
        self._by_session.setdefault(i.session_id, set()).add(i.id)

    def save_session(self, session: Session) -> None:
        row = (_key_text(session.id, "session id"), _key_text(session.task_id, "task_id"), session.key_hash,
               session.mode, session.status, session.created_at, session.last_active, session.ended_at,
               session.exported_at, _json(session.metadata))
        self._submit([(_UPSERT_SESSION, row)])

    def save_meta(self, key: str, value: Any) -> None:
        self._submit([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, _json(value)))])

    def _dynamic(self, i: Interaction) -> tuple[Any, ...]:
        return (i.prefix_key, i.status, encode_ints(i.output_ids), encode_floats(i.output_logprobs),
                encode_ints(i.output_versions), i.finish_reason, i.stop_kind,
                _json(message_to_openai(i.output_message)) if i.output_message is not None else None,
                i.reward, _text(i.error), i.completed_at)

    def _static(self, i: Interaction) -> tuple[Any, ...]:
        base = self._live.get(i.parent_id) if i.parent_id else None
        prompt_base_len = 0
        messages_skip = 0
        same_tools = False
        if base is not None:
            bp, bo = base.prompt_ids, base.output_ids
            lp, lo = len(bp), len(bo)
            if len(i.prompt_ids) >= lp + lo and i.prompt_ids[:lp] == bp and i.prompt_ids[lp:lp + lo] == bo:
                prompt_base_len = lp + lo
            elif len(i.prompt_ids) >= lp and i.prompt_ids[:lp] == bp:
                prompt_base_len = lp
            messages_skip = _common_prefix_len(base.messages, i.messages)
            same_tools = i.tools == base.tools
        tools = None if same_tools else _tools_json(i.tools)
        self._seq += 1
        return (i.id, self._seq, _key_text(i.session_id, "session id"), i.api, i.parent_id, i.relation, i.fork_reason,
                i.context_key, base.id if base is not None else None, prompt_base_len,
                encode_ints(i.prompt_ids[prompt_base_len:]), messages_skip, _messages_json(i.messages[messages_skip:]),
                tools, _json(i.sampling), int(i.client_store), i.created_at)

    def save_interaction(self, interaction: Interaction) -> None:
        i = interaction
        if i.id in self._inserted:
            self._submit([(_UPDATE_INTERACTION, (*self._dynamic(i), i.id))])
            return
        row = (*self._static(i), *self._dynamic(i))
        self._track(i)
        self._inserted.add(i.id)
        self._submit([(_INSERT_INTERACTION, row)])

    def delete_session(self, session_id: str) -> None:
        for iid in self._by_session.pop(session_id, ()):
            self._live.pop(iid, None)
            self._inserted.discard(iid)
        self._submit([("DELETE FROM interactions WHERE session_id=?", (session_id,)),
                      ("DELETE FROM sessions WHERE id=?", (session_id,))])

    # ------------------------------------------------------------------ barrier

    def _error_between(self, lo: int, hi: int) -> str | None:
        for seq, err in self._failures:
            if lo < seq <= hi:
                return err
        return None

    async def wait_durable(self) -> None:
        """Return once the writes this request (task context) submitted are durable."""
        writes = _REQUEST_WRITES.get()
        mine = writes.pop(id(self), None) if writes else None
        if mine is None:
            return
        floor, target = mine
        if target > self._submitted:  # left by another store that had the same id() (closed, collected)
            return
        if self._committed < target:
            self._commit_pending()  # no need to wait for the end of this loop iteration
        with self._state:
            if self._durable < target and self._closed:
                raise StoreError("the store was closed before this change was written")
            if self._durable >= target:
                err = self._error_between(floor, target) if self._failures else None
                if err is not None:
                    raise StoreError(err)
                return
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((floor, target, loop, fut))
        await fut

    def flush(self, timeout: float | None = None) -> None:
        """Commit what is pending and block until it is durable."""
        self._commit_pending()
        target = self._committed
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state:
            self._state.notify_all()
            while self._durable < target and self._syncer.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StoreError(f"store flush timed out with {target - self._durable} commits not yet synced")
                self._state.wait(left)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        with self._state:
            self._closed = True
            self._state.notify_all()
        self._syncer.join()
        self._wake_waiters()  # resolves everything: durable ones succeed, the rest fail (closed)
        with self._db_lock:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - best effort
                log.exception("store: checkpoint at close failed")
            self._conn.close()
        os.close(self._lock_fd)
        log.info("store %s closed (%d commits of %d writes, %d fsyncs, %d checkpoints, %d failed writes)",
                 self.path, self.stats["commits"], self.stats["writes"], self.stats["fsyncs"],
                 self.stats["checkpoints"], self.stats["failed_writes"])

    def _wake_waiters(self) -> None:
        with self._state:
            durable = self._durable
            if self._closed:
                ready, self._waiters = self._waiters, []
            else:
                ready = [w for w in self._waiters if w[1] <= durable]
                self._waiters = [w for w in self._waiters if w[1] > durable]
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], str | None]]] = {}
        for floor, target, loop, fut in ready:
            if target > durable:
                err: str | None = "the store was closed before this change was written"
            else:
                err = self._error_between(floor, target) if self._failures else None
            by_loop.setdefault(loop, []).append((fut, err))
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, futs)  # one wake-up per loop, not per waiter
            except RuntimeError:  # the loop is closed
                pass

    # ------------------------------------------------------------------ sync thread

    MIN_FSYNC_INTERVAL_S = 0.001  # at most ~1000 fsyncs a second; each covers every commit before it
    CHECKPOINT_INTERVAL_S = 1.0  # checkpoint the WAL into the database at most this often (if it changed)

    def _sync_forever(self) -> None:
        """fsync the WAL after commits ("full") and checkpoint it, off the event loop."""
        wal = self.path.with_name(self.path.name + "-wal")
        ckpt = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        ckpt.execute("PRAGMA busy_timeout=5000")
        checkpointed_at, checkpointed_upto = time.monotonic(), 0
        wal_fd: int | None = None
        synced_at = 0.0
        try:
            while True:
                with self._state:
                    if self._durable >= self._committed and not self._closed:
                        self._state.wait(self.CHECKPOINT_INTERVAL_S)
                    target, closing = self._committed, self._closed
                if target > self._durable:
                    if self.synchronous == "full":
                        # back-to-back fsyncs: let the commits of the next millisecond join this one
                        pause = synced_at + self.MIN_FSYNC_INTERVAL_S - time.monotonic()
                        if pause > 0 and not closing:
                            time.sleep(pause)
                            target = self._committed
                        wal_fd = self._fsync(wal, wal_fd)
                        synced_at = time.monotonic()
                    with self._state:
                        self._durable = max(self._durable, target)
                        self._state.notify_all()
                    self._wake_waiters()
                now = time.monotonic()
                if target > checkpointed_upto and now - checkpointed_at >= self.CHECKPOINT_INTERVAL_S:
                    try:
                        ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)")
                        self.stats["checkpoints"] += 1
                        checkpointed_at, checkpointed_upto = now, target
                    except sqlite3.Error as exc:
                        log.warning("store: checkpoint failed (will retry): %r", exc)
                if closing and self._durable >= self._committed:
                    return
        finally:
            ckpt.close()
            if wal_fd is not None:
                os.close(wal_fd)

    def _fsync(self, wal: Path, fd: int | None) -> int | None:
        """fdatasync the WAL (what SQLite's own FULL mode does on Linux); returns the fd kept open."""
        if fd is not None and os.fstat(fd).st_nlink == 0:  # the WAL file was removed and recreated
            os.close(fd)
            fd = None
        if fd is None:
            try:
                fd = os.open(wal, os.O_RDONLY)
            except FileNotFoundError:
                return None  # nothing was ever written to the WAL
        os.fdatasync(fd)
        self.stats["fsyncs"] += 1
        return fd

    # ------------------------------------------------------------------ transactions

    def _write(self, jobs: list[tuple[int, list[tuple[str, tuple[Any, ...]]]]]) -> list[tuple[int, str]]:
        c = self._conn
        try:
            c.execute("BEGIN")
            for _, ops in jobs:
                for sql, params in ops:
                    c.execute(sql, params)
            c.execute("COMMIT")
            self.stats["commits"] += 1
            self.stats["writes"] += len(jobs)
            return []
        except Exception:  # noqa: BLE001 - isolate the bad write below
            log.exception("store: a batch of %d writes failed; retrying them one by one", len(jobs))
            self._rollback()
        failed = []
        for seq, ops in jobs:
            try:
                c.execute("BEGIN")
                for sql, params in ops:
                    c.execute(sql, params)
                c.execute("COMMIT")
                self.stats["commits"] += 1
                self.stats["writes"] += 1
            except Exception as exc:  # noqa: BLE001
                self._rollback()
                log.error("store: write %d failed: %r", seq, exc)
                failed.append((seq, f"the trajectory store could not write: {exc}"))
                self.stats["failed_writes"] += 1
        return failed

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _resolve(fut: asyncio.Future[None], err: str | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(StoreError(err))


def _resolve_all(futs: list[tuple[asyncio.Future[None], str | None]]) -> None:
    for fut, err in futs:
        _resolve(fut, err)
