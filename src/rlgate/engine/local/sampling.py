"""Sampling for the local engine: one token per row, per-request generators.

Logits arrive on the CPU in float32. Every request owns a ``torch.Generator`` (seeded from
``SamplingParams.seed`` or from an engine-level RNG) and its token is drawn by inverse-CDF
sampling from its own row with one uniform from its own generator, so a seeded request
produces the same tokens whatever else is in the batch (up to float noise).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlgate.engine.base import SamplingParams

__all__ = ["sample_tokens"]


def sample_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Pick one token per row of ``logits`` ([B, V], float32, CPU); return tokens and logprobs.

    The logprob is ``log_softmax(logits / T)`` at the token (plain log-softmax when greedy),
    not renormalised by top-k / top-p. Each sampled row consumes exactly one uniform from
    its own generator.
    """
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    greedy = temps == 0
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if sampled:
        u = torch.stack([torch.rand((), generator=generators[i]) for i in sampled])
        tokens[sampled] = _inverse_cdf(logp[sampled].exp(), u, [params[i] for i in sampled])
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), chosen.tolist()


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Draw one token per row of ``probs`` with uniforms ``u``, honouring top-k / top-p."""
    vocab = probs.shape[-1]
    tokens = torch.empty(probs.shape[0], dtype=torch.long)
    truncated = [i for i, p in enumerate(params) if p.top_p < 1 or 0 < p.top_k < vocab]
    full = sorted(set(range(len(params))) - set(truncated))
    if full:
        tokens[full] = _search(probs[full].cumsum(-1), u[full])
    if truncated:
        sorted_p, order = probs[truncated].sort(dim=-1, descending=True, stable=True)
        rank = torch.arange(vocab)
        top_k = torch.tensor([params[i].top_k if params[i].top_k > 0 else vocab for i in truncated])
        top_p = torch.tensor([params[i].top_p for i in truncated], dtype=probs.dtype)
        # keep the k most likely tokens, and the smallest prefix whose mass reaches top_p
        keep = (rank[None, :] < top_k[:, None]) & ((sorted_p.cumsum(-1) - sorted_p) < top_p[:, None])
        keep[:, 0] = True
        picked = _search((sorted_p * keep).cumsum(-1), u[truncated])
        tokens[truncated] = order.gather(1, picked[:, None])[:, 0]
    return tokens


def _search(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index whose cumulative mass exceeds ``u * total`` (never a zero-mass token)."""
    target = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=cdf.shape[-1] - 1)
