"""Loading a model directory: tokenizer, stop tokens, context length (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class NoChatTemplate(ValueError):
    """A checkpoint whose tokenizer has no chat template (a base model) and none was given."""


def load_tokenizer(model_dir: str | Path, chat_template: str | Path | None = None) -> Any:
    """The checkpoint's tokenizer; ``chat_template``: a Jinja file to use instead of (or where
    there is no) template of its own (an operator's file, never a client's)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if chat_template is not None:
        tok.chat_template = Path(chat_template).expanduser().read_text()
    if not getattr(tok, "chat_template", None):
        raise NoChatTemplate(
            f"{model_dir} has no chat template (a base model?): pass --chat-template FILE (a Jinja chat "
            f"template), or save one as {Path(model_dir) / 'chat_template.jinja'}")
    return tok


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def stop_token_ids(tokenizer: Any, model_dir: str | Path | None = None) -> list[int]:
    """eos of the tokenizer + eos ids of generation_config.json / config.json, in that order."""
    ids = _ids(getattr(tokenizer, "eos_token_id", None))
    if model_dir is not None:
        for name in ("generation_config.json", "config.json"):
            p = Path(model_dir) / name
            if p.is_file():
                try:
                    ids += _ids(json.loads(p.read_text()).get("eos_token_id"))
                except (json.JSONDecodeError, OSError, ValueError, TypeError):
                    pass
    out: list[int] = []
    for i in ids:
        if i not in out:
            out.append(i)
    if not out:
        raise ValueError("could not determine stop token ids; set them in the config")
    return out


def context_length(model_dir: str | Path) -> int | None:
    p = Path(model_dir) / "config.json"
    if not p.is_file():
        return None
    cfg = json.loads(p.read_text())
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    text = cfg.get("text_config") or {}
    v = text.get("max_position_embeddings")
    return int(v) if isinstance(v, int) else None
