"""The redaction hook: an operator's function applied to every sample before a trainer gets it.

``--redaction-hook package.module:attribute`` names a callable ``(sample: dict) -> dict | None``:
it receives an exported sample (``trajectory/sample.py``'s dict: messages, token ids, logprobs...)
and returns the sample to hand over, changed as it likes, or None to withhold it. It is loaded once
at start-up from the operator's configuration, like ``--history-matcher``; nothing a request says
is ever imported or run. Masking text is not enough when the token ids stay: a hook that removes
personal data from ``messages`` must mask the matching ids too, or withhold the sample.

The gateway applies it to every sample of ``/export_trajectories`` and ``/rl/collect``
(``SessionManager.redact``); an in-process trainer applies the same function
(``app.state.online.redact``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgate.object_spec import load_object

__all__ = ["Redactor", "load_redactor"]

Redactor = Callable[[dict[str, Any]], dict[str, Any] | None]


def load_redactor(path: str) -> Redactor:
    """The callable at ``package.module:attribute``; ``ValueError`` says why it cannot be used."""
    obj = load_object(path, "--redaction-hook")
    if not callable(obj):
        raise ValueError(f"--redaction-hook {path!r} is not callable")
    hook: Redactor = obj
    return hook
