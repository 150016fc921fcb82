"""LoRA adapters resident on the local engine's model, each batch row with its own (or none).

A PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``, what
``PeftModel.save_pretrained`` writes and ``train.lora`` checkpoints hold) is read into an
:class:`AdapterBank`. The base weights are held once; every adapted ``nn.Linear`` gets one forward
hook, which adds each row's own low-rank update to the layer's output:

    y[b] = W x[b] + s_k (x[b] A_k^T) B_k^T          (k: row b's adapter; no adapter: nothing added)

The adapters of a module are stacked, so one forward serves rows of any mix of adapters with two
matrix products per adapted layer, whatever the number of adapters in the batch:

    h = x A^T            A: [N*R, in], adapter k's A in rows k*R .. k*R + r_k (zeros beyond r_k)
    h = h * m            m[b]: s_k on row b's block of R columns, 0 elsewhere
    y += h B             B: [N*R, out], adapter k's B^T in the same rows

Only the adapters some row of the batch uses take part (``N`` is their number; a batch of rows of
one adapter multiplies by that adapter alone). This is what PEFT computes for a row of that
adapter, ``W x + (x A^T B^T) * s``, up to float rounding (the scale is applied before the second
product: tests/test_engine_lora.py compares the recorded logprobs with PEFT's model of each adapter
alone). Rows without an adapter get exactly the base model's output (``+ 0``; a batch without
adapter rows runs no hook work at all).

The hooks act only on the engine's worker thread, while :meth:`AdapterBank.plan` has set which
adapter each row uses; a forward anywhere else (a colocated trainer's, the fake vLLM server's
teacher-forced pass on :attr:`LocalEngine.model`) sees the base model.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlgate.engine.base import WeightUpdateError

__all__ = ["AdapterBank", "LoraAdapter", "read_adapter"]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"
# adapter_config.json settings that change what a LoRA layer computes: refused unless off (or empty)
_UNSUPPORTED = ("use_dora", "modules_to_save", "alpha_pattern", "rank_pattern", "layer_replication", "lora_bias",
                "fan_in_fan_out", "trainable_token_indices", "target_parameters", "alora_invocation_tokens",
                "use_qalora", "use_bdlora")


@dataclass
class LoraAdapter:
    """One adapter as read from its directory: per adapted module, A [r, in], B [out, r], and the scale."""

    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (A, B)
    scale: float  # lora_alpha / r (use_rslora: / sqrt(r))
    rank: int

    @property
    def num_parameters(self) -> int:
        return sum(a.numel() + b.numel() for a, b in self.weights.values())


def read_adapter(directory: Path, model: torch.nn.Module) -> LoraAdapter:
    """The PEFT LoRA adapter in ``directory`` (checked: :class:`WeightUpdateError` on anything this bank
    cannot serve exactly), matched to ``model``'s linear layers. Reads files: call it off the event loop."""
    from safetensors.torch import load_file

    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise WeightUpdateError(f"{directory} holds no readable {CONFIG_FILE} ({exc}): not a PEFT adapter") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise WeightUpdateError(f"{directory}/{CONFIG_FILE}: peft_type {config.get('peft_type')!r} is not LORA")
    used = [k for k in _UNSUPPORTED if config.get(k)]
    if config.get("bias", "none") != "none":
        used.append("bias")
    if used:
        raise WeightUpdateError(f"{directory}: the adapter uses {', '.join(used)}, which the local engine does not "
                                "serve (plain LoRA on linear layers only)")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise WeightUpdateError(f"{directory}/{CONFIG_FILE}: r and lora_alpha must be numbers (r >= 1)")
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise WeightUpdateError(f"{directory} holds no {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(path), device="cpu")
    except Exception as exc:  # corrupt or unreadable file
        raise WeightUpdateError(f"cannot read {path}: {exc}") from exc
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        end = _A if key.endswith(_A) else _B if key.endswith(_B) else None
        if end is None or not key.startswith(_PREFIX):
            raise WeightUpdateError(f"{path.name}: tensor {key!r} is not a LoRA A or B matrix of a linear layer")
        pairs.setdefault(key[len(_PREFIX):-len(end)], {})[end] = value
    if not pairs:
        raise WeightUpdateError(f"{path.name} holds no LoRA weights")
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, ab in sorted(pairs.items()):
        layer = modules.get(name)
        if not isinstance(layer, torch.nn.Linear):
            raise WeightUpdateError(f"{path.name}: {name!r} is not a linear layer of the served model")
        a, b = ab.get(_A), ab.get(_B)
        if a is None or b is None:
            raise WeightUpdateError(f"{path.name}: {name!r} has only one of lora_A and lora_B")
        if a.shape != (rank, layer.in_features) or b.shape != (layer.out_features, rank):
            raise WeightUpdateError(f"{path.name}: {name!r} has A {tuple(a.shape)} and B {tuple(b.shape)}; the "
                                    f"layer is {layer.in_features} -> {layer.out_features} and r is {rank}")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise WeightUpdateError(f"{path.name}: {name!r} holds NaN or infinite values")
        weights[name] = (a.float(), b.float())
    scale = float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return LoraAdapter(weights, scale, rank)


def _trim() -> None:
    """Return the heap's free memory to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class _Stack:
    """The adapters of one linear layer, stacked (see the module docstring)."""

    a: torch.Tensor  # [N*R, in]
    b: torch.Tensor  # [N*R, out]
    handle: Any  # the forward hook's handle
    sub: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # by active slots


@dataclass
class _Plan:
    """Which adapter each row of the forward in progress uses."""

    thread: int
    slots: tuple[int, ...]  # active slots (indices into the bank's order), ascending
    mask: torch.Tensor  # [B, 1, len(slots)*R]: the row's scale on its block


class AdapterBank:
    """The adapters resident on one model, by name, each with its version. Worker-thread only, except
    the read-only :meth:`version` / :meth:`names` / :meth:`__contains__` (consistent snapshots)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        p = next(model.parameters())
        self._device, self._dtype = p.device, p.dtype
        self._adapters: dict[str, LoraAdapter] = {}  # insertion order = slot order
        self._versions: dict[str, int] = {}
        self._rank = 0  # R: the largest rank resident
        self._stacks: dict[str, _Stack] = {}
        self._plan: _Plan | None = None

    def __contains__(self, name: object) -> bool:
        return name in self._versions

    def __len__(self) -> int:
        return len(self._versions)

    def names(self) -> list[str]:
        return list(self._versions)

    def version(self, name: str) -> int:
        return self._versions[name]

    def versions(self) -> dict[str, int]:
        return dict(self._versions)

    def parameter_bytes(self) -> int:
        """Bytes of the stacked adapter weights (what the adapters add to the model in memory)."""
        return sum(s.a.numel() * s.a.element_size() + s.b.numel() * s.b.element_size() for s in self._stacks.values())

    # -- changes (worker thread, between steps) -------------------------------------------------

    def put(self, name: str, adapter: LoraAdapter, version: int | None = None) -> int:
        """Add ``name`` (version ``version``, default 0) or replace its weights (version + 1); return it."""
        new = version if version is not None else (self._versions[name] + 1 if name in self._versions else 0)
        before = dict(self._adapters), dict(self._versions)
        self._adapters[name] = adapter
        self._versions[name] = new
        self._change(before)
        return new

    def remove(self, name: str) -> None:
        before = dict(self._adapters), dict(self._versions)
        self._adapters.pop(name, None)
        self._versions.pop(name, None)
        self._change(before)

    def _change(self, before: tuple[dict[str, LoraAdapter], dict[str, int]]) -> None:
        """Restack after a change of the adapters; if that fails (out of memory), as they were before. The old
        stacks' memory goes back to the system (glibc keeps freed blocks of this size otherwise)."""
        try:
            self._restack()
        except BaseException:
            self._adapters, self._versions = before
            self._restack()
            raise
        finally:
            _trim()

    def _restack(self) -> None:
        modules = dict(self._model.named_modules())
        names = sorted({m for a in self._adapters.values() for m in a.weights})
        self._rank = max((a.rank for a in self._adapters.values()), default=0)
        n, r = len(self._adapters), self._rank
        for name in list(self._stacks):
            if name not in names:
                self._stacks.pop(name).handle.remove()
        for name in names:
            layer = modules[name]
            assert isinstance(layer, torch.nn.Linear)
            a = torch.zeros(n * r, layer.in_features)
            b = torch.zeros(n * r, layer.out_features)
            for k, adapter in enumerate(self._adapters.values()):
                if name in adapter.weights:
                    la, lb = adapter.weights[name]
                    a[k * r:k * r + adapter.rank] = la
                    b[k * r:k * r + adapter.rank] = lb.T
            a, b = a.to(self._device, self._dtype), b.to(self._device, self._dtype)
            old = self._stacks.get(name)
            if old is not None:
                old.a, old.b, old.sub = a, b, {}
            else:
                self._stacks[name] = _Stack(a, b, layer.register_forward_hook(self._hook(name)))
        # Each adapter's weights become views of the stacks: the stacks are the only copy held (the tensors read
        # from its directory are freed), and the next restack reads them back from there.
        for k, adapter in enumerate(self._adapters.values()):
            for name in adapter.weights:
                stack = self._stacks[name]
                rows = slice(k * r, k * r + adapter.rank)
                adapter.weights[name] = (stack.a[rows], stack.b[rows].T)

    # -- a forward -----------------------------------------------------------------------------

    @contextmanager
    def plan(self, adapters: Sequence[str | None]) -> Iterator[None]:
        """Within the block, a forward on this thread applies row b's adapter ``adapters[b]`` (None: none)."""
        order = {name: k for k, name in enumerate(self._adapters)}
        rows = [order[a] if a is not None else -1 for a in adapters]
        slots = tuple(sorted({k for k in rows if k >= 0}))
        if not slots:
            yield
            return
        scales = [a.scale for a in self._adapters.values()]
        where = {k: i for i, k in enumerate(slots)}
        r = self._rank
        mask = torch.zeros(len(rows), 1, len(slots) * r)
        for row, k in enumerate(rows):
            if k >= 0:
                mask[row, 0, where[k] * r:(where[k] + 1) * r] = scales[k]
        self._plan = _Plan(threading.get_ident(), slots, mask.to(self._device, self._dtype))
        try:
            yield
        finally:
            self._plan = None

    def _weights(self, stack: _Stack, slots: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if len(slots) * self._rank == stack.a.shape[0]:
            return stack.a, stack.b
        found = stack.sub.get(slots)
        if found is None:
            r = self._rank
            idx = torch.tensor([k * r + j for k in slots for j in range(r)], device=self._device)
            found = stack.a.index_select(0, idx), stack.b.index_select(0, idx)
            if len(stack.sub) >= 2:  # the set of adapters in a batch changes now and then; a bounded few
                stack.sub.clear()
            stack.sub[slots] = found
        return found

    def _hook(self, name: str) -> Any:
        def add_lora(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            plan = self._plan
            if plan is None or plan.thread != threading.get_ident():
                return output
            a, b = self._weights(self._stacks[name], plan.slots)
            x = args[0]
            if x.dim() != 3 or x.shape[0] != plan.mask.shape[0]:
                raise RuntimeError(f"LoRA on {name}: input of shape {tuple(x.shape)}; expected [rows, tokens, features]")
            h = torch.matmul(x, a.T)
            h.mul_(plan.mask)
            return output.add_(torch.matmul(h, b))

        return add_lora
