"""Checkpoint loading for the local engine: safetensors directories, matched to the model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch

from rlgate.engine.base import WeightUpdateError
from rlgate.engine.weights_path import checkpoint_dir

__all__ = ["load_safetensors_dir", "match_state_dict"]


def load_safetensors_dir(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read every ``*.safetensors`` file of a checkpoint directory (sharded or not), once the
    directory passed the check every engine makes (:func:`rlgate.engine.weights_path.checkpoint_dir`)."""
    from safetensors.torch import load_file

    files = checkpoint_dir(path).files
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(f), device="cpu")
        except Exception as e:  # corrupt or unreadable file
            raise WeightUpdateError(f"cannot read {f}: {e}") from e
        duplicated = state.keys() & part.keys()
        if duplicated:
            raise WeightUpdateError(f"{f.name} repeats tensors of another shard: {_names(duplicated)}")
        state.update(part)
    return state


def match_state_dict(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pair each incoming tensor with the model tensor it replaces, or raise WeightUpdateError.

    Names and shapes must match the model's ``state_dict`` exactly. A name may be absent
    only if it is tied to (is the same tensor as) a name that is present, e.g.
    ``lm_head.weight`` with ``tie_word_embeddings``.
    """
    targets = model.state_dict(keep_vars=True)
    aliases: dict[int, set[str]] = {}
    for name, t in targets.items():
        aliases.setdefault(id(t), set()).add(name)
    unexpected = [n for n in state if n not in targets]
    missing = [n for n, t in targets.items() if n not in state and not (aliases[id(t)] & state.keys())]
    mismatched = [
        f"{n}: checkpoint {tuple(t.shape)} vs model {tuple(targets[n].shape)}"
        for n, t in state.items()
        if n in targets and t.shape != targets[n].shape
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({_names(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected ({_names(unexpected)})")
    if mismatched:
        problems.append(f"{len(mismatched)} with a different shape ({_names(mismatched)})")
    if problems:
        raise WeightUpdateError("incompatible weights: " + "; ".join(problems))
    return [(targets[n], t) for n, t in state.items()]


def _names(names: Sequence[str] | set[str], limit: int = 5) -> str:
    names = sorted(names)
    more = f", ... {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
