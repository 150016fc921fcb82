"""The policy's token logprobs over a padded batch of samples, in forward chunks.

A training step runs the policy over every sample's tokens, but only needs logits where
the loss is (the generated tokens). Two savings, neither of which changes a logprob or a
gradient beyond float rounding (tests/test_train_speed.py):

* **trimmed logits** (``grpo.trim_logits``): the ``lm_head`` and its log-softmax run only
  from the position before a chunk's earliest generated token on (``logits_to_keep``);
* **shared prompts** (``grpo.share_prompt``): the samples of a GRPO group start with the same
  prompt, so the prompt (all but its last token) runs **once**: its keys and values (with
  their autograd graph) are the cache the group's completions are run against, expanded to
  the chunk's batch. The backward pass then flows into the prompt's computation once per
  chunk (a sum: the same gradient as one forward per sample). On the real demo
  (SmolLM2-135M-Instruct, 4 groups × 8 samples of a ~56-token prompt and ≤ 8 generated
  tokens) the prompt is ~85% of the tokens a step trains on.

A chunk is a set of rows of the batch run in one forward: at most ``micro_batch_size`` rows,
sorted by length so each chunk is cut to its longest row. Rows sharing a prompt prefix of at
least ``MIN_SHARED`` tokens go to chunks of their own; the chunks of one prefix come one after
the other, and only the last may free the prefix's graph (``Chunk.last``).

Sharing needs a decoder whose every layer attends to the whole context (no sliding window, no
chunked attention: their caches keep only part of the prompt) and no gradient checkpointing
(transformers turns the cache off under it). :func:`can_share` says whether a model qualifies,
and why not.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from rlgate.train.loss import logits_to_keep, token_logprobs

MIN_SHARED = 8  # a shorter common prompt is not worth a forward of its own


@dataclass
class Chunk:
    rows: torch.Tensor  # indices into the batch
    width: int  # the chunk's longest row: the positions its forward covers
    prefix: int = 0  # > 0: the first ``prefix`` tokens, the same in every row, come from a shared forward
    first: bool = True  # the first chunk of its prefix (the prefix's forward runs before it)
    last: bool = True  # the last chunk of its prefix (its backward may free the prefix's graph)


def plan_chunks(batch: dict[str, torch.Tensor], rows: torch.Tensor, micro_batch_size: int,
                share: bool) -> list[Chunk]:
    """The forward chunks covering ``rows`` of ``batch`` (right-padded, as ``to_padded_tensors``)."""
    lengths = batch["attention_mask"].sum(1).cpu()
    rest = rows
    chunks: list[Chunk] = []
    if share:
        loss = batch["loss_mask"].cpu()
        ids = batch["input_ids"].cpu()
        by_prefix: dict[tuple[int, ...], list[int]] = {}
        for r in rows.tolist():
            hits = loss[r].nonzero()
            if hits.numel() == 0:
                continue
            p = int(hits[0]) - 1  # the token before the first generated one is the suffix's first
            if p >= MIN_SHARED:
                by_prefix.setdefault(tuple(ids[r, :p].tolist()), []).append(r)
        shared: set[int] = set()
        for prefix, members in by_prefix.items():
            if len(members) < 2:
                continue
            shared.update(members)
            idx = torch.tensor(members)
            idx = idx[torch.argsort(lengths[idx], descending=True, stable=True)]
            parts = [idx[s:s + micro_batch_size] for s in range(0, len(idx), micro_batch_size)]
            for i, part in enumerate(parts):
                chunks.append(Chunk(part, int(lengths[part].max()), len(prefix), first=i == 0,
                                    last=i == len(parts) - 1))
        rest = torch.tensor([r for r in rows.tolist() if r not in shared], dtype=torch.long)
    if len(rest):
        rest = rest[torch.argsort(lengths[rest], descending=True, stable=True)]
        for s in range(0, len(rest), micro_batch_size):
            part = rest[s:s + micro_batch_size]
            chunks.append(Chunk(part, int(lengths[part].max())))
    return chunks


def can_share(model: Any) -> tuple[bool, str]:
    """Whether the prompt of a group can be run once for all its samples, and if not, why."""
    try:
        from transformers import DynamicCache  # noqa: F401
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:
        return False, "this transformers has no DynamicCache"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = (getattr(base, "is_activation_checkpointing", None) if hasattr(base, "is_activation_checkpointing")
                     else getattr(base, "is_gradient_checkpointing", False))
    if checkpointing:
        return False, "gradient checkpointing turns the cache off"
    config = getattr(base, "config", None)
    if config is None:
        return False, "the model has no transformers config"
    try:
        types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception as exc:  # noqa: BLE001 - an architecture this helper does not know: no sharing, said why
        return False, f"its layer types are unknown ({type(exc).__name__})"
    other = sorted({t for t in types if t != "full_attention"})
    if other:
        return False, f"its layers include {', '.join(other)} (the cache would not hold the whole prompt)"
    if _cache_kwarg(base) is None:
        return False, "its forward takes no cache"
    return True, ""


def _cache_kwarg(model: Any) -> str | None:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((k for k in ("cache", "past_key_values") if k in params), None)


class PolicyForward:
    """Runs chunks of a batch through a model; holds the current shared prefix between chunks."""

    def __init__(self, *, trim_logits: bool, share: bool, autocast: Any = None) -> None:
        self.trim_logits = trim_logits
        self.share = share
        self.autocast = autocast  # a torch dtype for torch.autocast, or None
        self._prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _ctx(self, device: torch.device) -> Any:
        if self.autocast is None:
            return torch.autocast(device.type, enabled=False)
        return torch.autocast(device.type, dtype=self.autocast)

    def logprobs(self, model: Any, batch: dict[str, torch.Tensor], chunk: Chunk, temps: torch.Tensor,
                 entropy: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Token logprobs [rows, width] of ``chunk`` (0.0 where no logit was computed), at each row's
        temperature ``temps`` [rows]; with ``entropy``, appends the sampling distribution's entropy per
        position [rows, width] (no grad)."""
        sub = {k: v[chunk.rows.to(v.device), :chunk.width] for k, v in batch.items() if k != "rewards"}
        device = sub["input_ids"].device
        with self._ctx(device):
            if chunk.prefix:
                logits = self._suffix_logits(model, sub, chunk)
            else:
                kwargs: dict[str, Any] = {}
                keep = logits_to_keep(sub["loss_mask"])
                if self.trim_logits and keep < chunk.width and _takes_logits_to_keep(model):
                    kwargs["logits_to_keep"] = keep  # the prompt's logits (and their log-softmax) are never computed
                logits = model(input_ids=sub["input_ids"], attention_mask=sub["attention_mask"].long(),
                               **kwargs).logits
        if chunk.prefix and chunk.last:
            self._prefix = None
        if entropy is not None:  # of the sampling distribution (at the sample's temperature), per position
            with torch.no_grad():
                t = torch.where(temps > 0, temps, torch.ones_like(temps)).to(logits.device).view(-1, 1, 1)
                lp = torch.log_softmax(logits[:, :-1].float() / t, dim=-1)
                skip = chunk.width - logits.shape[1] + 1
                entropy.append(torch.nn.functional.pad(-(lp.exp() * lp).sum(-1), (skip, 0)))
        return token_logprobs(logits, sub["input_ids"], temps)

    def _suffix_logits(self, model: Any, sub: dict[str, torch.Tensor], chunk: Chunk) -> torch.Tensor:
        from transformers import DynamicCache

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        name = _cache_kwarg(base) or "past_key_values"
        if chunk.first or self._prefix is None:
            prefix = sub["input_ids"][:1, :chunk.prefix]
            out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)
            cache = getattr(out, "cache", None) or out.past_key_values
            self._prefix = [(layer.keys, layer.values) for layer in cache.layers]
        n = len(chunk.rows)
        cache = DynamicCache([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in self._prefix])
        return model(input_ids=sub["input_ids"][:, chunk.prefix:], attention_mask=sub["attention_mask"].long(),
                     **{name: cache}).logits


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (transformers' causal LMs do; a PEFT
    wrapper passes it on to the model it wraps)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False
