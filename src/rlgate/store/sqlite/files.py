"""The store's files: an exclusive lock next to the database, and owner-only permissions.

The file (and SQLite's ``-wal`` / ``-shm`` files, which inherit its mode) is created 0600
in a 0700 directory. A ``.lock`` file next to it holds an exclusive ``flock`` while the
store is open: a second gateway on the same file refuses to start.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from rlgate.store.base import StoreError

__all__ = ["StoreLocked", "lock_and_create"]

log = logging.getLogger("rlgate.store")


class StoreLocked(StoreError):
    """Another process has the store open."""


def lock_and_create(path: Path) -> int:
    """Take the store's lock and create its file 0600; return the lock's file descriptor."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StoreLocked(f"store {path} is in use by another rlgate process") from exc
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    # SQLite creates -wal / -shm with the database file's mode: make it 0600 first.
    created = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(created)
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists() and (p.stat().st_mode & 0o077):
            log.warning("store file %s was readable by others: setting mode 0600", p)
            os.chmod(p, 0o600)
    return fd
