"""Checkpoints of a run: ``out_dir/checkpoints/step-NNNNNN/`` + a ``latest`` marker.

Each holds the model (``save_pretrained``), the tokenizer files of the starting model and
``trainer_state.pt`` (optimiser state, step, version, metric history). A checkpoint is
written to ``step-N.tmp`` and renamed, so a crash never leaves a half-written one marked
latest. Only the last ``keep`` are kept (0: all).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model")


def latest_checkpoint(out_dir: Path) -> Path | None:
    marker = out_dir / "checkpoints" / "latest"
    if marker.is_file():
        path = out_dir / "checkpoints" / marker.read_text().strip()
        if (path / "trainer_state.pt").is_file():
            return path
    return None


def save_checkpoint(out_dir: Path, trainer: Any, state: Any, tokenizer_dir: Path, *, keep: int = 0) -> Path:
    import torch

    root = out_dir / "checkpoints"
    path = root / f"step-{state.step:06d}"
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and not (tmp / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    torch.save({"optimizer": trainer.optimizer.state_dict(), "step": state.step, "version": state.version,
                "history": state.history}, tmp / "trainer_state.pt")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    (root / "latest").write_text(path.name)
    if keep:
        for old in sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return path


def load_trainer_state(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path / "trainer_state.pt", weights_only=False)
