"""The ``--admin-key-file`` of a running gateway: written once, then locked while the gateway runs.

A second ``rlgate serve`` pointed at the same file (on the same port or another) must not replace the
key the running gateway's clients hold: the gateway keeps an ``flock`` on the file for its whole
life, and a newcomer that finds it locked exits with one line.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rlgate.secret_files import write_secret_file

__all__ = ["claim_key_file", "publish_key_file"]


def claim_key_file(path: Path) -> None:
    """SystemExit if a running gateway holds ``path`` (its ``--admin-key-file``): rewriting it would
    lock that gateway's clients out."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no file yet (or unreadable: writing it will say so)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"rlgate: --admin-key-file {path} holds the admin key of a running gateway; "
                         "not overwriting it (choose another file, or stop that gateway first)") from None
    finally:
        os.close(fd)


def publish_key_file(path: Path, key: str) -> int:
    """Write the key (0600, not through a link) and lock the file; returns the descriptor holding the
    lock, which stays open (and the lock held) until this process exits."""
    write_secret_file(path, key + "\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another gateway claimed it in between: it keeps it
        os.close(fd)
        raise SystemExit(f"rlgate: --admin-key-file {path} was claimed by another gateway meanwhile") from None
    return fd
