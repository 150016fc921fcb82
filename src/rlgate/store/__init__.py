"""rlgate.store: where sessions and interactions are persisted.

``open_store(spec)``: ``":memory:"`` keeps nothing beyond the process (tests, benchmarks);
anything else is the path of a SQLite file (created 0600). See docs/operations.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlgate.store.base import MemoryStore, Store, StoreError, StoreOptions, Synchronous

__all__ = ["MemoryStore", "Store", "StoreError", "StoreOptions", "default_data_dir", "open_store", "STORE_FILE_NAME"]

STORE_FILE_NAME = "rlgate.sqlite"


def default_data_dir() -> Path:
    """``$RLGATE_DATA_DIR``, else ``$XDG_DATA_HOME/rlgate``, else ``~/.local/share/rlgate``."""
    env = os.environ.get("RLGATE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "rlgate"


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and every missing parent with mode 0700 (``mkdir -p`` would give the
    parents the umask's mode, e.g. 0755, and so let others list the data directory's tree)."""
    missing = []
    d = directory
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask


def open_store(spec: str | os.PathLike[str] | None = None, *, data_dir: str | os.PathLike[str] | None = None,
               synchronous: Synchronous = StoreOptions.store_sync) -> Store:
    """The store for ``--store SPEC`` (``None``: ``DATA_DIR/rlgate.sqlite``). Raises
    :class:`StoreError` with one line saying why when the file cannot be used."""
    if spec is not None and str(spec) == ":memory:":
        return MemoryStore()
    import sqlite3

    from rlgate.store.sqlite import SQLiteStore

    path = Path(spec).expanduser() if spec is not None else Path(data_dir or default_data_dir()) / STORE_FILE_NAME
    try:
        make_private_dirs(path.parent)
        return SQLiteStore(path, synchronous=synchronous)
    except StoreError:
        raise
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot use the store {path}: {exc}") from exc
