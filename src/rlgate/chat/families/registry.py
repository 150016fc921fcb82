"""Which family a checkpoint belongs to: detection, the registry, the ``--renderer`` override.

Detection reads ``config.json`` (``model_type``, ``architectures``) and the tokenizer (its chat
template and added tokens), never the directory name: fine-tunes keep their family's template,
renamed checkpoints are still recognised, and a checkpoint whose template matches no family gets
the generic Jinja renderer. ``rlgate serve --renderer NAME`` (``GatewayConfig.model_family``)
overrides detection; ``--renderer jinja`` forces the generic renderer with the family's parsers
left to the template's markup.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlgate.chat.families import (
    deepseek_r1,
    gemma3,
    glm45,
    gpt_oss,
    kimi_k2,
    llama3,
    qwen3,
    qwen3_5,
    qwen3_2507,
    smollm2,
)
from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.generic import generic_family

# Most specific first: the first family whose detector accepts the checkpoint wins.
FAMILIES: tuple[ModelFamily, ...] = (
    gpt_oss.FAMILY,
    glm45.FAMILY,
    kimi_k2.FAMILY,
    deepseek_r1.FAMILY,
    llama3.FAMILY,
    qwen3_5.QWEN36,
    qwen3_5.QWEN35,
    qwen3_2507.THINKING,
    qwen3_2507.INSTRUCT,
    qwen3.FAMILY,
    smollm2.FAMILY,
    gemma3.FAMILY,
)


def family_names() -> list[str]:
    return [f.name for f in FAMILIES] + ["jinja"]


def checkpoint_info(tokenizer: Any, model_dir: str | Path | None = None) -> CheckpointInfo:
    """What detection looks at (``model_dir`` defaults to where the tokenizer was loaded from)."""
    cfg: dict[str, Any] = {}
    src = model_dir if model_dir is not None else getattr(tokenizer, "name_or_path", None)
    if src:
        p = Path(src) / "config.json"
        if p.is_file():
            try:
                cfg = json.loads(p.read_text())
            except (OSError, ValueError):
                cfg = {}
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates: the default one decides
        template = template.get("default", "") or ""
    vocab = frozenset(str(t) for t in getattr(tokenizer, "added_tokens_encoder", {}) or {})
    return CheckpointInfo(
        model_type=str(cfg.get("model_type", "")),
        architectures=tuple(cfg.get("architectures") or ()),
        chat_template=template,
        vocab=vocab,
    )


def get_family(name: str, info: CheckpointInfo | None = None) -> ModelFamily:
    """The family called ``name`` ("jinja": the generic renderer)."""
    if name in ("jinja", "generic"):
        return generic_family(info or CheckpointInfo())
    for f in FAMILIES:
        if f.name == name:
            return f
    raise ValueError(f"unknown renderer {name!r}; known: {family_names()}")


def detect_family(info: CheckpointInfo) -> ModelFamily:
    for f in FAMILIES:
        if f.detect(info):
            return f
    return generic_family(info)


def resolve_family(tokenizer: Any, name: str | None = None, model_dir: str | Path | None = None) -> ModelFamily:
    """``name`` if given (``None`` / "auto": detect from the checkpoint)."""
    info = checkpoint_info(tokenizer, model_dir)
    if name and name != "auto":
        return get_family(name, info)
    return detect_family(info)
