"""Model families: per-family rendering, bridging and parsing (see base.py and registry.py).

One file per family declares a :class:`~rlgate.chat.families.base.ModelFamily`; the registry
detects a checkpoint's family from its config and chat template.
"""

from __future__ import annotations

from rlgate.chat.families.base import (
    BridgeError,
    CheckpointInfo,
    ModelFamily,
    ParentTurn,
    PromptRenderer,
    TemplateError,
)

__all__ = [
    "BridgeError",
    "CheckpointInfo",
    "ModelFamily",
    "ParentTurn",
    "PromptRenderer",
    "TemplateError",
]
