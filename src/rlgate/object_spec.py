"""The one loader of ``package.module:attribute`` names an operator writes in a configuration.

A training config's ``agent`` and ``reward``, ``--group-reward``, ``--heldout-check``,
``--redaction-hook``, ``--history-matcher`` and a CLI agent's ``setup`` / ``verifier`` all name a
Python object this way; :func:`load_object` imports it and says, naming the setting, why it cannot.
Only operator configuration reaches it: no route imports anything a request names
(docs/security.md).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from typing import Any

__all__ = ["ObjectSpecError", "exception_text", "load_object"]


class ObjectSpecError(ValueError):
    """The name cannot be loaded; the message names the setting and why."""


def load_object(spec: str, setting: str, *, cwd_importable: bool = False) -> Any:
    """The object ``spec`` names (``package.module:attribute``, the attribute may be dotted).

    ``setting`` names the option in errors. ``cwd_importable``: the current directory is put on
    ``sys.path`` first (a training config's agent module next to it).
    """
    module_name, sep, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise ObjectSpecError(f"{setting} {spec!r}: expected package.module:attribute")
    cwd = os.getcwd()
    if cwd_importable and cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):  # the module itself (or its package) is missing
            raise ObjectSpecError(f"{setting}: cannot import module {module_name!r}: no {exc.name}.py or package "
                                  f"{exc.name!r} in {cwd} or on sys.path (PYTHONPATH)") from None
        raise ObjectSpecError(f"{setting}: importing {module_name!r} failed: {exception_text(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the module raised at import: show where
        raise ObjectSpecError(f"{setting}: importing {module_name!r} failed: {exception_text(exc)}") from None
    where = module_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {where}:{close[0]}?" if close and where == module_name else (
                f"; did you mean {where}.{close[0]}?" if close else "")
            file = f" ({obj.__file__})" if where == module_name and getattr(obj, "__file__", None) else ""
            raise ObjectSpecError(f"{setting}: {'module' if where == module_name else 'object'} {where!r}{file} "
                                  f"has no {part!r}{hint}")
        obj = getattr(obj, part)
        where = f"{where}:{part}" if where == module_name else f"{where}.{part}"
    return obj


def exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).rstrip()
