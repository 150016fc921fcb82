"""``make test-core`` puts this folder on PYTHONPATH: every Python process of the run (pytest and the
``rlgate serve`` / fake-server subprocesses it starts) then behaves as if torch were not installed:
``importlib.util.find_spec("torch")`` is None and ``import torch`` raises ModuleNotFoundError."""

import os

if os.environ.get("RLGATE_TESTS_NO_TORCH") == "1":
    from importlib.machinery import PathFinder

    _find_spec = PathFinder.find_spec

    def _without_torch(cls, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name == "torch" or name.startswith("torch."):
            return None
        return _find_spec(name, path, target)

    PathFinder.find_spec = classmethod(_without_torch)  # type: ignore[method-assign,assignment]
