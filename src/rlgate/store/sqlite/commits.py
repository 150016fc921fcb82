"""The write path: group commit on the event loop, fsync and checkpoints on a thread.

``submit`` appends a change (SQL statements with plain values) to a pending list. At the
end of the event-loop iteration everything pending is committed in one transaction on the
event-loop thread (group commit); ``wait_durable()`` commits at once instead of waiting for
the end of the iteration. The connection runs with ``synchronous=NORMAL`` and without
automatic checkpoints, so a commit only appends to the WAL file (page cache: microseconds)
and never waits for the disk. A background thread does what does wait for the disk: in
``"full"`` mode it fsyncs the WAL after commits (one fsync covers every commit made while
the previous one ran) and it checkpoints the WAL into the database file once a second.

Why not a writer thread: it was measured (benchmarks/load.py, gateway CPU per request).
Handing every write to a thread makes the event loop and the writer trade the GIL several
times per write: +0.9 to +1.1 ms per request (+40 %) in either sync mode. Committing on
the loop costs +0.35 ms in "normal" mode; "full" mode still pays about +0.9 ms, for the
fsync itself and the hand-offs to and from the sync thread (one per group of commits).

Folding: a change submitted under a ``key`` (an interaction's insert) can be amended while
it still waits for its commit (``amend``): a turn that completes within the loop iteration
it started in (every non-streamed reply from a fast engine) is then written as one insert
of its final row instead of an insert and an update. The amending change gets its own
sequence number, committed with the write it amended, and failed with it.

The barrier: ``submit`` returns the change's sequence number; ``wait_durable(seqs)``
returns once those writes (and all before them) are durable, and raises
:class:`StoreError` only if one of *them* failed. A failed transaction is retried one write
at a time, so one bad write cannot sink the others. An ``UPDATE`` that matches no row fails
too: the row it meant to change was never written (a write that failed before), and a
change reported as done must not vanish silently. ``on_failed`` hears of every failed
change, so the caller can forget what it believed written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlgate.store.base import StoreError

__all__ = ["GroupCommit"]

log = logging.getLogger("rlgate.store")

Job = tuple[int, list[tuple[str, tuple[Any, ...]]]]  # (write seq, the statements of one change)
MAX_FAILURES_KEPT = 10_000  # failed writes remembered for wait_durable (the oldest are forgotten)


class GroupCommit:
    """The write connection, its pending changes, and the barrier (see the module docstring).

    ``synchronous``: ``"full"``: a change is durable once the WAL holding it is fsynced;
    ``"normal"``: once it is committed to the WAL.
    """

    MIN_FSYNC_INTERVAL_S = 0.001  # at most ~1000 fsyncs a second; each covers every commit before it
    CHECKPOINT_INTERVAL_S = 1.0  # checkpoint the WAL into the database at most this often (if it changed)

    def __init__(self, conn: sqlite3.Connection, path: Path, *, synchronous: str,
                 on_failed: Callable[[list[tuple[str, tuple[Any, ...]]]], None] | None = None) -> None:
        self.conn = conn
        self.on_failed = on_failed
        self.path = path
        self.synchronous = synchronous
        self.db_lock = threading.Lock()  # the connection: event loop, close(), reads at startup
        # Writes wait in _pending until the end of the current event-loop iteration, then all of
        # them are committed in one transaction (group commit); wait_durable() commits at once.
        self._pending: list[Job] = []
        self._pending_keys: dict[str, int] = {}  # key -> index in _pending of a change that may be amended
        self._aliases: dict[int, int] = {}  # seq of an amending change -> seq of the write it folded into
        self._pending_lock = threading.Lock()
        self._commit_loop: asyncio.AbstractEventLoop | None = None  # loop with a commit scheduled
        self._state = threading.Condition()
        self._submitted = 0  # seq of the last write submitted
        self._committed = 0  # seq up to which every write was committed (or failed)
        self._durable = 0  # seq up to which commits are durable (fsynced in "full" mode)
        self._failures: dict[int, str] = {}  # seq -> error, of writes that failed (oldest first)
        # (seqs waited for, the largest of them, the waiter's loop, its future)
        self._waiters: list[tuple[frozenset[int], int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.closed = False
        self.truncation_lock_s = 0.0  # how long the last WAL truncation held the write connection
        self.stats = {"commits": 0, "writes": 0, "failed_writes": 0, "fsyncs": 0, "checkpoints": 0,
                      "truncations": 0}
        self._syncer = threading.Thread(target=self._sync_forever, name="rlgate-store-sync", daemon=True)
        self._syncer.start()

    @property
    def synced(self) -> bool:
        """Is every committed write durable (fsynced in "full" mode)?"""
        with self._state:
            return self._durable >= self._committed

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Read with the write connection (at startup, before any write; online records: after
        :meth:`commit_pending`, so that a read sees every write submitted before it)."""
        with self.db_lock:
            return self.conn.execute(sql, params).fetchall()

    # ------------------------------------------------------------------ writes (event loop side)

    def submit(self, ops: list[tuple[str, tuple[Any, ...]]], *, key: str | None = None) -> int:
        """Queue one change and return its sequence number; it is committed at the end of this
        event-loop iteration. A change submitted after close is dropped: waiting for it fails.
        ``key``: later changes may :meth:`amend` this one until it is committed."""
        if self.closed:
            log.error("store closed: dropping a write (%s)", ops[0][0].split(" (")[0])
            with self._pending_lock:
                self._submitted += 1
                return self._submitted
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._pending_lock:
            self._submitted += 1
            seq = self._submitted
            self._pending.append((seq, ops))
            if key is not None:
                self._pending_keys[key] = len(self._pending) - 1
            schedule = loop is not None and self._commit_loop is None
            if schedule:
                self._commit_loop = loop
            # no loop, or another loop scheduled the commit: do not depend on it running
            now = not schedule and (loop is None or self._commit_loop is not loop)
        if schedule and loop is not None:  # one transaction for everything submitted during this iteration
            loop.call_soon(self.commit_pending)
        elif now:
            self.commit_pending()
        return seq

    def amend(self, key: str, change: Callable[[list[tuple[str, tuple[Any, ...]]]],
                                               list[tuple[str, tuple[Any, ...]]]]) -> int | None:
        """Fold a change into the write submitted under ``key`` if that write still waits for its
        commit: its statements become ``change(statements)``. Returns the folded change's own
        sequence number (durable with that write, failed with it), or None when no write is
        pending under ``key`` (then submit the change as usual)."""
        with self._pending_lock:
            index = self._pending_keys.get(key)
            if index is None or self.closed:
                return None
            seq0, ops = self._pending[index]
            self._pending[index] = (seq0, change(ops))
            self._submitted += 1
            seq = self._submitted
            self._pending.append((seq, []))  # keeps the sequence numbers in commit order
            self._aliases[seq] = seq0
            return seq

    def commit_pending(self) -> None:
        """Commit everything submitted so far, in one transaction (on the calling thread)."""
        with self._pending_lock:
            jobs, self._pending = self._pending, []
            aliases, self._aliases = self._aliases, {}
            self._pending_keys = {}
            self._commit_loop = None
            if not jobs:
                return
            with self.db_lock:  # still under _pending_lock: transactions commit in seq order
                failed = self._write(jobs)
            if failed and aliases:  # a folded change fails with the write it was folded into
                errors = dict(failed)
                failed += [(seq, errors[seq0]) for seq, seq0 in aliases.items() if seq0 in errors]
        upto = jobs[-1][0]
        with self._state:
            self._committed = upto
            for seq, err in failed:
                self._failures[seq] = err
            while len(self._failures) > MAX_FAILURES_KEPT:
                del self._failures[next(iter(self._failures))]
            if self.synchronous == "normal":  # written to the OS: survives the process
                self._durable = upto
            else:
                self._state.notify_all()  # the sync thread fsyncs it
        if self.synchronous == "normal" and self._waiters:
            self._wake_waiters()

    # ------------------------------------------------------------------ barrier

    def _error_in(self, seqs: frozenset[int]) -> str | None:
        for seq in seqs:
            err = self._failures.get(seq)
            if err is not None:
                return err
        return None

    async def wait_durable(self, seqs: Sequence[int]) -> None:
        """Return once the writes numbered ``seqs`` (and every write before them) are durable.

        Raises :class:`StoreError` if one of those writes failed, or if the store was closed
        before they were written. Sequence numbers are :meth:`submit`'s; 0 stands for no write.
        """
        wanted = frozenset(s for s in seqs if s)
        if not wanted:
            return
        target = max(wanted)
        if target > self._submitted:
            raise ValueError(f"write {target} was not submitted to this store")
        loop = asyncio.get_running_loop()
        if self._committed < target and self._commit_loop is not loop:
            self.commit_pending()  # no commit is scheduled on this loop: do not wait for one
        # else the commit scheduled at the end of this loop iteration covers ``target``, with
        # every other change submitted meanwhile: one transaction for all of them (committing
        # here instead made one transaction per request: 2 of 3 SQLite calls of the hot path)
        with self._state:
            if self._durable < target and self.closed:
                raise StoreError("the store was closed before this change was written")
            if self._durable >= target:
                err = self._error_in(wanted) if self._failures else None
                if err is not None:
                    raise StoreError(err)
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((wanted, target, loop, fut))
        await fut

    def flush(self, timeout: float | None = None) -> None:
        """Commit what is pending and block until it is durable."""
        self.commit_pending()
        target = self._committed
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state:
            self._state.notify_all()
            while self._durable < target and self._syncer.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StoreError(f"store flush timed out with {target - self._durable} commits not yet synced")
                self._state.wait(left)

    def truncate_wal(self, attempts: int = 100) -> None:
        """Checkpoint every WAL frame into the database file and truncate the WAL to 0 bytes (blocking: a
        deletion calls it on a thread once its writes are durable, so that the old page versions the WAL
        still holds - the deleted rows' text - are gone from disk before its answer). Runs on the write
        connection under its lock: an event-loop commit meanwhile waits for it (the WAL holds at most about
        a second of writes: the sync thread checkpoints every second). The emptied WAL is fsynced too."""
        self.commit_pending()
        # first the bulk of the work (copying frames, syncing the database) without the write connection's lock
        side = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            side.execute("PRAGMA busy_timeout=1000")
            side.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:  # the truncation below does it all anyway
            pass
        finally:
            side.close()
        for _ in range(attempts):
            with self.db_lock:
                locked = time.perf_counter()
                self.conn.execute("PRAGMA busy_timeout=20")  # never wait long with the lock held
                try:
                    busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                except sqlite3.OperationalError:  # "database is locked": the sync thread's checkpoint runs
                    busy = 1
                finally:
                    self.conn.execute("PRAGMA busy_timeout=5000")
                    self.truncation_lock_s = time.perf_counter() - locked
            if not busy:
                self._fsync_wal_file()
                self.stats["truncations"] += 1
                return
            time.sleep(0.01)  # the sync thread's own checkpoint holds the checkpoint lock: retry
        raise StoreError("the WAL could not be checkpointed and truncated (the database stayed busy)")

    def _fsync_wal_file(self) -> None:
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Flush, stop the sync thread, fail the waiters left, checkpoint and close the connection."""
        if self.closed:
            return
        self.flush()
        with self._state:
            self.closed = True
            self._state.notify_all()
        self._syncer.join()
        self._wake_waiters()  # resolves everything: durable ones succeed, the rest fail (closed)
        with self.db_lock:
            try:
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - best effort
                log.exception("store: checkpoint at close failed")
            self.conn.close()
        log.info("store %s closed (%d commits of %d writes, %d fsyncs, %d checkpoints, %d failed writes)",
                 self.path, self.stats["commits"], self.stats["writes"], self.stats["fsyncs"],
                 self.stats["checkpoints"], self.stats["failed_writes"])

    def _wake_waiters(self) -> None:
        with self._state:
            durable = self._durable
            if self.closed:
                ready, self._waiters = self._waiters, []
            else:
                ready = [w for w in self._waiters if w[1] <= durable]
                self._waiters = [w for w in self._waiters if w[1] > durable]
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], str | None]]] = {}
        for wanted, target, loop, fut in ready:
            if target > durable:
                err: str | None = "the store was closed before this change was written"
            else:
                err = self._error_in(wanted) if self._failures else None
            by_loop.setdefault(loop, []).append((fut, err))
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, futs)  # one wake-up per loop, not per waiter
            except RuntimeError:  # the loop is closed
                pass

    # ------------------------------------------------------------------ sync thread

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
                    if self._durable >= self._committed and not self.closed:
                        self._state.wait(self.CHECKPOINT_INTERVAL_S)
                    target, closing = self._committed, self.closed
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

    def _write(self, jobs: list[Job]) -> list[tuple[int, str]]:
        c = self.conn
        try:
            c.execute("BEGIN")
            for _, ops in jobs:
                _execute(c, ops)
            c.execute("COMMIT")
            self.stats["commits"] += 1
            self.stats["writes"] += len(jobs)
            return []
        except Exception:  # isolate the bad write below
            log.exception("store: a batch of %d writes failed; retrying them one by one", len(jobs))
            self._rollback()
        failed = []
        for seq, ops in jobs:
            try:
                c.execute("BEGIN")
                _execute(c, ops)
                c.execute("COMMIT")
                self.stats["commits"] += 1
                self.stats["writes"] += 1
            except Exception as exc:  # this write fails alone; its requests get StoreError
                self._rollback()
                log.error("store: write %d failed: %r", seq, exc, exc_info=True)
                failed.append((seq, f"the trajectory store could not write: {exc}"))
                self.stats["failed_writes"] += 1
                if self.on_failed is not None:
                    self.on_failed(ops)
        return failed

    def _rollback(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


class _NoRow(sqlite3.Error):
    """An UPDATE matched no row."""


def _execute(c: sqlite3.Connection, ops: list[tuple[str, tuple[Any, ...]]]) -> None:
    for sql, params in ops:
        cur = c.execute(sql, params)
        if sql.startswith("UPDATE") and cur.rowcount == 0:
            raise _NoRow(f"the row this change updates was never written ({sql.split(' SET ')[0]})")


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
