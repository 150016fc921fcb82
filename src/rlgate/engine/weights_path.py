"""The one check of a checkpoint directory named by a weight update, for every engine.

``POST /rl/update_weights {"path": ...}``, a cluster replica's load and a restarted replica's
reload all reach an engine's ``update_weights_from_path``; the fake, local and remote (SGLang,
vLLM) engines all call :func:`checkpoint_dir` first, so a path is accepted or refused the same
way whichever engine serves, before anything is paused or loaded. A refusal is a
:class:`WeightUpdateError` (HTTP 400, code ``weight_update_failed``).

A checkpoint directory is:

* an **absolute** path (a relative one would depend on the gateway's working directory, and mean
  something else to a remote backend), without NUL or other control characters;
* an existing **directory** (it may be reached through symlinks, e.g. ``latest -> sync-000042``);
* holding at least one ``*.safetensors`` file, each a **regular file** (not a FIFO or a device,
  whose reading could block or never end) that lies **inside the directory** once symlinks are
  resolved: a file symlinked to somewhere else (``model.safetensors -> /etc/shadow``) is refused.

The local engine then reads exactly the files listed here (:attr:`Checkpoint.files`) and checks
every tensor's name and shape against its model; the fake engine only counts them; a remote engine
sends the path to its backends, which load it themselves, so there the directory must be visible
at the same path to the gateway and to the backends (shared storage, as ``RemoteSync`` already
requires).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rlgate.engine.base import WeightUpdateError

__all__ = ["ADAPTER_CONFIG", "MAX_PATH_CHARS", "Checkpoint", "adapter_dir", "checkpoint_dir"]

MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter directory holds it


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint directory."""

    path: str  # as given
    directory: Path  # resolved (symlinks followed)
    files: tuple[Path, ...]  # its *.safetensors files, resolved, in name order


def _shown(path: str) -> str:
    return repr(path if len(path) <= 200 else path[:200] + "...")


def checkpoint_dir(path: str | os.PathLike[str]) -> Checkpoint:
    """Check ``path`` (see the module docstring); raise :class:`WeightUpdateError` (400) if it is not a
    checkpoint directory. Touches the filesystem: call it off the event loop."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise WeightUpdateError("the checkpoint path must be a non-empty string")
    if len(path) > MAX_PATH_CHARS:
        raise WeightUpdateError(f"checkpoint path too long ({len(path)} characters; at most {MAX_PATH_CHARS})")
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in path):
        raise WeightUpdateError(f"checkpoint path {_shown(path)} holds control characters")
    if not os.path.isabs(path):
        raise WeightUpdateError(f"checkpoint path {_shown(path)} is not absolute: give the full path of the "
                                "directory, as the gateway sees it")
    try:
        directory = Path(path).resolve(strict=True)
        is_dir = directory.is_dir()
    except (OSError, RuntimeError, ValueError):  # missing, unreadable parent, symlink loop, unencodable
        raise WeightUpdateError(f"checkpoint directory not found: {_shown(path)}") from None
    if not is_dir:
        raise WeightUpdateError(f"checkpoint directory not found: {_shown(path)} is not a directory")
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.name.endswith(".safetensors"))
    except OSError as exc:
        raise WeightUpdateError(f"cannot list the checkpoint directory {_shown(path)}: {exc.strerror}") from None
    if not names:
        raise WeightUpdateError(f"no *.safetensors files in {_shown(path)}")
    files = []
    for name in names:
        try:
            real = (directory / name).resolve(strict=True)
            mode = real.stat().st_mode
        except (OSError, RuntimeError, ValueError):
            raise WeightUpdateError(f"{name} in {_shown(path)} cannot be read (a broken symlink?)") from None
        if directory not in real.parents:
            raise WeightUpdateError(f"{name} in {_shown(path)} is a symlink to a file outside the checkpoint "
                                    "directory")
        if not stat.S_ISREG(mode):
            raise WeightUpdateError(f"{name} in {_shown(path)} is not a regular file")
        files.append(real)
    return Checkpoint(path, directory, tuple(files))


def adapter_dir(path: str | os.PathLike[str]) -> Checkpoint:
    """Check a LoRA adapter directory (``POST /rl/policies``, a policy's weight push): a checkpoint
    directory as above that also holds ``adapter_config.json``, a regular file inside it. The same
    :class:`WeightUpdateError` (400) otherwise; the adapter's contents are checked by the engine."""
    found = checkpoint_dir(path)
    try:
        real = (found.directory / ADAPTER_CONFIG).resolve(strict=True)
        regular = stat.S_ISREG(real.stat().st_mode)
    except (OSError, RuntimeError, ValueError):
        raise WeightUpdateError(f"no {ADAPTER_CONFIG} in {_shown(found.path)}: not a LoRA adapter directory (PEFT's "
                                "save_pretrained writes one)") from None
    if found.directory not in real.parents or not regular:
        raise WeightUpdateError(f"{ADAPTER_CONFIG} in {_shown(found.path)} is not a regular file inside the directory")
    return found
