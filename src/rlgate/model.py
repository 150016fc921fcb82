"""Loading a model directory: tokenizer, stop tokens, context length (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{model_dir}: the tokenizer has no chat template")
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
