"""Secrets on disk (the admin key, Ray's auth token): mode 0600, never through a planted link."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_secret_file"]


def write_secret_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 without following a link planted at ``path``:
    a new file is written next to it (created 0600, exclusively) and renamed over the path,
    which replaces a symlink itself rather than the file it points to."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
