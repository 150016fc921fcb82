"""What the trainer writes next to a checkpoint for serving so that a gateway can check the engine
serves exactly those weights (engine/weight_check.py), and the tied output layer written out.

* :func:`write_probe` — ``rlgate-probe.json``: a fixed token sequence (``PROBE_TOKENS`` ids drawn
  from the vocabulary with a fixed seed: the same for every checkpoint of a model) and the
  teacher-forced ``log_softmax(logits)`` of each of its tokens under the model as saved (eval mode,
  no autocast, float32 softmax). ~One forward pass of 32 tokens.
* :func:`serving_tensors` — the state dict to save, with a model that ties its output layer to its
  input embeddings (``tie_word_embeddings``: SmolLM2, Qwen2.5-0.5B, Gemma) given the output layer
  as a tensor of its own. ``save_pretrained`` otherwise drops it, and vLLM's in-place reload
  (``reload_weights``) then updates the input embeddings but not the output layer its CPU build
  pre-packs: the served policy is a mix of two checkpoints (docs/remote-engines.md). Every engine
  loads the extra tensor: vLLM into its output layer, the local engine and transformers into the
  tied one (same values), SGLang skips it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rlgate.engine.weight_check import PROBE_FILE, PROBE_FORMAT

__all__ = ["PROBE_SEED", "PROBE_TOKENS", "probe_ids", "serving_tensors", "tied_output_name", "write_probe"]

PROBE_TOKENS = 32
PROBE_SEED = 20261204


def probe_ids(vocab_size: int, n: int = PROBE_TOKENS, seed: int = PROBE_SEED) -> list[int]:
    """The probe's token ids: ``n`` ids in ``[0, vocab_size)`` from a fixed seed."""
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(n)]


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model


def tied_output_name(model: Any) -> tuple[str, str] | None:
    """(output layer weight name, input embedding weight name) when ``model`` ties them, else None."""
    base = _base(model)
    out, emb = base.get_output_embeddings(), base.get_input_embeddings()
    if out is None or emb is None or out.weight is not emb.weight:
        return None
    names = [n for n, p in base.named_parameters(remove_duplicate=False) if p is emb.weight]
    out_names = [n for n, m in base.named_modules() if m is out]
    if len(names) < 1 or len(out_names) != 1:
        return None
    out_name = f"{out_names[0]}.weight"
    emb_name = next((n for n in names if n != out_name), None)
    return (out_name, emb_name) if emb_name is not None else None


def serving_tensors(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (the weights an engine serves) with a tied output layer as a tensor of its own."""
    tied = tied_output_name(model)
    out = {k: v.contiguous() for k, v in state.items()}
    if tied is not None and tied[1] in out:
        out[tied[0]] = out[tied[1]].detach().clone()
    return out


def write_probe(model: Any, path: Path) -> dict[str, Any]:
    """Compute ``model``'s probe and write it into the checkpoint directory ``path``; return it."""
    import torch

    base = _base(model)
    vocab = int(base.get_input_embeddings().weight.shape[0])
    ids = probe_ids(vocab)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type=next(model.parameters()).device.type, enabled=False):
            x = torch.tensor([ids], device=next(model.parameters()).device)
            logits = model(input_ids=x).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(1, x[0, 1:, None])[:, 0]
    finally:
        model.train(was_training)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    probe = {"format": PROBE_FORMAT, "input_ids": ids, "logprobs": [float(v) for v in logp.tolist()], "dtype": dtype}
    (path / PROBE_FILE).write_text(json.dumps(probe))
    return probe
