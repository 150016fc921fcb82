"""The local engine's KV cache: left padded, appended in place, rows selected and merged.

All running requests share one cache, **left padded**: row ``b`` holds its real tokens at
the right end of the sequence axis, preceded by padding. Left padding keeps the distance
between two tokens of a row equal to their distance in the sequence axis, so causal (and
sliding-window) masks stay correct.

* **Appending.** Each layer keeps its keys/values in a buffer with spare capacity that grows
  geometrically, so appending a token writes in place instead of concatenating (and copying)
  the whole cache at every step, as ``DynamicLayer`` would.
* **Leaving.** :meth:`PaddedCache.select_rows` keeps some rows (an index select);
  :meth:`PaddedCache.trim_left` drops columns that became padding in every row (a view).
* **Joining.** :meth:`PaddedCache.concat` stacks two caches along the batch axis, left
  padding the shorter one: one copy per join, never per step.

The classes subclass transformers' ``DynamicLayer`` / ``DynamicCache`` so that any model
that accepts a ``Cache`` accepts them.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["PaddedCache", "SlabLayer", "attention_layer_count", "left_pad_2d"]

# Extra sequence capacity allocated whenever a cache buffer is (re)built.
MIN_HEADROOM = 64


def headroom(length: int) -> int:
    return max(MIN_HEADROOM, length // 2)


class SlabLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views into a larger buffer.

    ``self.keys`` is always ``self._k[:, :, :length]`` so everything transformers reads
    (sequence length, mask sizes) behaves as for a plain ``DynamicLayer``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._k: torch.Tensor | None = None  # [B, kv_heads, capacity, head_dim]
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part of the cache (the layer must hold something)."""
        assert self.keys is not None and self.values is not None, "empty cache layer"
        return self.keys, self.values

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def set_buffers(self, k: torch.Tensor, v: torch.Tensor, length: int) -> None:
        self._k, self._v = k, v
        self.keys, self.values = k[:, :, :length], v[:, :, :length]
        self.device = k.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old, new = self.length, self.length + key_states.shape[-2]
        if self._k is None or new > self._k.shape[-2]:
            self._reserve(key_states, value_states, new + headroom(new))
        assert self._k is not None and self._v is not None
        self._k[:, :, old:new] = key_states
        self._v[:, :, old:new] = value_states
        self.set_buffers(self._k, self._v, new)
        return self.kv()

    def _reserve(self, ks: torch.Tensor, vs: torch.Tensor, capacity: int) -> None:
        b, h, _, dk = ks.shape
        k = ks.new_empty(b, h, capacity, dk)
        v = vs.new_empty(b, h, capacity, vs.shape[-1])
        if self.length:
            k[:, :, : self.length], v[:, :, : self.length] = self.kv()
        self._k, self._v = k, v

    def select_rows(self, rows: torch.Tensor) -> None:
        if self._k is not None and self._v is not None:
            self.set_buffers(self._k.index_select(0, rows), self._v.index_select(0, rows), self.length)

    def trim_left(self, n: int) -> None:
        if self._k is not None and self._v is not None and n > 0:
            self.set_buffers(self._k[:, :, n:], self._v[:, :, n:], self.length - n)


class PaddedCache(DynamicCache):
    """A left-padded batched cache made of :class:`SlabLayer` s."""

    def __init__(self, num_layers: int) -> None:
        # Bypass DynamicCache.__init__ (it would build plain DynamicLayers from a config).
        Cache.__init__(self, layers=[SlabLayer() for _ in range(num_layers)])

    @property
    def slabs(self) -> list[SlabLayer]:
        return cast(list[SlabLayer], self.layers)

    def select_rows(self, rows: torch.Tensor) -> None:
        for layer in self.slabs:
            layer.select_rows(rows)

    def trim_left(self, n: int) -> None:
        for layer in self.slabs:
            layer.trim_left(n)

    @classmethod
    def concat(cls, a: PaddedCache, b: PaddedCache) -> PaddedCache:
        """Stack two caches along the batch axis, left padding the shorter one."""
        out = cls(len(a.layers))
        for la, lb, lo in zip(a.slabs, b.slabs, out.slabs, strict=True):
            length = max(la.length, lb.length)
            (ka, va), (kb, vb) = la.kv(), lb.kv()
            k = stack_left_padded(ka, kb, length + headroom(length))
            v = stack_left_padded(va, vb, length + headroom(length))
            lo.set_buffers(k, v, length)
        return out


def stack_left_padded(a: torch.Tensor, b: torch.Tensor, capacity: int) -> torch.Tensor:
    """[Ba, H, Sa, D] + [Bb, H, Sb, D] -> [Ba+Bb, H, capacity, D], right-aligned at max(Sa, Sb).

    Padding is zero-filled: masked positions get zero attention weight, and a zero (rather
    than uninitialised, possibly NaN) value keeps ``0 * value`` finite.
    """
    length = max(a.shape[-2], b.shape[-2])
    out = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], capacity, a.shape[-1])
    out[: a.shape[0], :, length - a.shape[-2] : length] = a
    out[a.shape[0] :, :, length - b.shape[-2] : length] = b
    return out


def left_pad_2d(x: torch.Tensor, length: int) -> torch.Tensor:
    """Left pad the last axis of ``x`` with zeros to ``length``."""
    return torch.nn.functional.pad(x, (length - x.shape[-1], 0))


def attention_layer_count(model: torch.nn.Module) -> int:
    """Number of KV cache layers; refuse models whose cache is not plain attention."""
    probe = DynamicCache(config=cast(PretrainedConfig, model.config))
    unsupported = {type(layer).__name__ for layer in probe.layers if not isinstance(layer, DynamicLayer)}
    if unsupported:
        raise ValueError(
            f"LocalEngine supports attention-only models; this one has {sorted(unsupported)} cache layers"
        )
    if not probe.layers:
        raise ValueError("cannot tell how many attention layers the model has")
    return len(probe.layers)
