"""The local engine's weight check (engine/weight_check.py): a swap that is undone unless the model
then serves the checkpoint's probe.

The local engine copies the checkpoint's tensors into its model itself, so a mismatch here means
the checkpoint is not what its probe says (another dtype, a probe computed for other weights),
not a bug of a server; the update fails the same way, and the previous weights are put back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rlgate.engine.weight_check import WeightCheck, WeightCheckFailed, WeightProbe, compare, failure_message

__all__ = ["checked_copy", "score"]


def score(model: torch.nn.Module, input_ids: Sequence[int]) -> list[float]:
    """Teacher-forced ``log_softmax(logits)`` of ``input_ids[1:]`` (the model's own forward, float32 softmax)."""
    with torch.inference_mode():
        device = next(model.parameters()).device
        ids = torch.tensor([list(input_ids)], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(1, ids[0, 1:, None])[:, 0].tolist()


def checked_copy(model: torch.nn.Module, pairs: list[tuple[torch.Tensor, torch.Tensor]], probe: WeightProbe | None,
                 *, path: str, tolerance: float | None) -> WeightCheck:
    """Copy each source into its target (between two decoding steps); with a probe, check the model
    against it and put the previous weights back (then raise :class:`WeightCheckFailed`) if it fails."""
    check = probe is not None and tolerance is not None
    saved = [t.detach().to("cpu", copy=True) for t, _ in pairs] if check else []
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)
    if not check:
        return WeightCheck(path, passed=True, skipped="the checkpoint has no probe" if probe is None
                           else "weight checks are off", where="local engine")
    assert probe is not None and tolerance is not None
    t0 = time.perf_counter()
    result = compare(probe, score(model, probe.input_ids), path=path, tolerance=tolerance, where="the local engine")
    result.seconds = time.perf_counter() - t0
    if not result.passed:
        with torch.no_grad():
            for (target, _), old in zip(pairs, saved, strict=True):
                target.copy_(old)
        raise WeightCheckFailed(failure_message(result) + "; the previous weights were put back", result)
    return result
