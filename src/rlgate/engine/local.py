"""In-process engine: a Hugging Face causal LM served with continuous batching.

Threads
-------
One daemon worker thread owns the generation loop. The asyncio side only validates a
request, puts it on a pending list and awaits its own ``asyncio.Queue``; the worker sends
each :class:`TokenDelta` back with ``loop.call_soon_threadsafe``, so the event loop is
never blocked by a forward pass. Weight updates are commands run by the worker *between*
decoding steps (reading checkpoint files happens before, off both threads' critical path).

Batching
--------
All running requests share one KV cache, **left padded**: row ``b`` holds its real tokens
at the right end of the sequence axis, preceded by padding. Alongside the cache the batch
keeps a 2-D attention mask ``[B, S]`` (0 on padding) and, per row, the number of real
tokens seen so far, which is passed explicitly as ``position_ids``. A decoding step feeds
one token per row, so every row advances by exactly one column.

* **Joining.** Requests that arrive while a batch is decoding are prefilled together (left
  padded to the longest newcomer) before the next step, then merged into the running batch:
  whichever of the two caches is shorter gets extra left padding and the two are
  concatenated along the batch axis. This copies the cache once per join, never per step.
* **Leaving.** Finished and aborted rows are dropped with an index select; sequence
  columns that became padding in every remaining row are trimmed from the left (a view).
* **Appending.** Each cache layer keeps its keys/values in a buffer with spare capacity
  that grows geometrically, so appending a token writes in place instead of concatenating
  (and copying) the whole cache at every step, as ``DynamicLayer`` would.

Left padding keeps the distance between two tokens of a row equal to their distance in
the sequence axis, so causal (and sliding-window) masks stay correct.

Sampling
--------
Logits are moved to the CPU in float32. Every request owns a ``torch.Generator`` (seeded
from ``SamplingParams.seed`` or from an engine-level RNG) and its token is drawn by
inverse-CDF sampling from its own row with one uniform from its own generator, so a seeded
request produces the same tokens whatever else is in the batch (up to float noise).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from rlgate.engine.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    StreamingEngineMixin,
    TokenDelta,
    WeightUpdateError,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["LocalEngine"]

# Most padded tokens (rows x longest prompt) prefilled in one forward pass; at least one
# request is always admitted, however long its prompt.
_PREFILL_TOKEN_BUDGET = 16384
# Extra sequence capacity allocated whenever a cache buffer is (re)built.
_MIN_HEADROOM = 64


# ----------------------------------------------------------------------------------------
# KV cache with left padding, in-place appends, row selection and merging
# ----------------------------------------------------------------------------------------


def _headroom(length: int) -> int:
    return max(_MIN_HEADROOM, length // 2)


class _SlabLayer(DynamicLayer):
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

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part of the cache (the layer must hold something)."""
        assert self.keys is not None and self.values is not None, "empty cache layer"
        return self.keys, self.values

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
            self._reserve(key_states, value_states, new + _headroom(new))
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


class _PaddedCache(DynamicCache):
    """A left-padded batched cache made of :class:`_SlabLayer` s."""

    def __init__(self, num_layers: int) -> None:
        # Bypass DynamicCache.__init__ (it would build plain DynamicLayers from a config).
        Cache.__init__(self, layers=[_SlabLayer() for _ in range(num_layers)])

    @property
    def slabs(self) -> list[_SlabLayer]:
        return self.layers  # type: ignore[return-value]

    def select_rows(self, rows: torch.Tensor) -> None:
        for layer in self.slabs:
            layer.select_rows(rows)

    def trim_left(self, n: int) -> None:
        for layer in self.slabs:
            layer.trim_left(n)

    @classmethod
    def concat(cls, a: _PaddedCache, b: _PaddedCache) -> _PaddedCache:
        """Stack two caches along the batch axis, left padding the shorter one."""
        out = cls(len(a.layers))
        for la, lb, lo in zip(a.slabs, b.slabs, out.slabs, strict=False):
            length = max(la.length, lb.length)
            (ka, va), (kb, vb) = la.kv(), lb.kv()
            k = _stack_left_padded(ka, kb, length + _headroom(length))
            v = _stack_left_padded(va, vb, length + _headroom(length))
            lo.set_buffers(k, v, length)
        return out


def _stack_left_padded(a: torch.Tensor, b: torch.Tensor, capacity: int) -> torch.Tensor:
    """[Ba, H, Sa, D] + [Bb, H, Sb, D] -> [Ba+Bb, H, capacity, D], right-aligned at max(Sa, Sb).

    Padding is zero-filled: masked positions get zero attention weight, and a zero (rather
    than uninitialised, possibly NaN) value keeps ``0 * value`` finite.
    """
    length = max(a.shape[-2], b.shape[-2])
    out = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], capacity, a.shape[-1])
    out[: a.shape[0], :, length - a.shape[-2] : length] = a
    out[a.shape[0] :, :, length - b.shape[-2] : length] = b
    return out


def _left_pad_2d(x: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (length - x.shape[-1], 0))


# ----------------------------------------------------------------------------------------
# Requests and the running batch
# ----------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Request:
    """Worker-side state of one generation."""

    input_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenDelta | BaseException]
    stop_ids: frozenset[int] = frozenset()
    num_generated: int = 0
    finished: bool = False  # set by the worker once the final delta is sent
    aborted: bool = False  # set by the consumer (stream closed early)

    @property
    def done(self) -> bool:
        return self.finished or self.aborted

    def push(self, item: TokenDelta | BaseException) -> None:
        """Hand an item to the consumer's event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            self.aborted = True

    def finish_with(self, item: TokenDelta | BaseException) -> None:
        if not self.done:
            self.finished = True
            self.push(item)


@dataclass(eq=False)
class _Batch:
    """The running rows and their shared left-padded cache (worker thread only)."""

    rows: list[_Request]
    cache: _PaddedCache
    mask: torch.Tensor  # [B, S] 1 = real token in the cache, 0 = padding
    positions: torch.Tensor  # [B] position id of each row's next input token
    next_tokens: list[int]  # sampled last step, not yet fed to the model

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` and trim columns that are now padding everywhere."""
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.next_tokens = [self.next_tokens[i] for i in keep]
        self.cache.select_rows(idx)
        self.mask = self.mask.index_select(0, idx)
        self.positions = self.positions.index_select(0, idx)
        used = self.mask.any(dim=0)
        first = int(used.to(torch.int8).argmax()) if bool(used.any()) else self.mask.shape[1]
        if first:
            self.cache.trim_left(first)
            self.mask = self.mask[:, first:]

    def extend(self, other: _Batch) -> None:
        """Merge ``other`` (freshly prefilled rows) into this batch."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        self.cache = _PaddedCache.concat(self.cache, other.cache)
        self.mask = torch.cat([_left_pad_2d(self.mask, length), _left_pad_2d(other.mask, length)])
        self.positions = torch.cat([self.positions, other.positions])
        self.rows = self.rows + other.rows  # a new list: other threads may be reading the old one
        self.next_tokens = self.next_tokens + other.next_tokens


@dataclass(eq=False)
class _Command:
    """Work run on the worker thread between decoding steps (weight swaps)."""

    fn: Callable[[], int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int] = field(repr=False)

    def resolve(self, result: int | None = None, error: BaseException | None = None) -> None:
        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)  # type: ignore[arg-type]

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:
            pass


# ----------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------


def load_safetensors_dir(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read every ``*.safetensors`` file of a checkpoint directory (sharded or not)."""
    from safetensors.torch import load_file

    root = Path(path)
    if not root.is_dir():
        raise WeightUpdateError(f"checkpoint directory not found: {root}")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"no *.safetensors files in {root}")
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


# ----------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------


class LocalEngine(StreamingEngineMixin):
    """Serve a Hugging Face causal LM in this process with continuous batching."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        model: PreTrainedModel | None = None,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
        max_context_length: int | None = None,
    ) -> None:
        if (model_path is None) == (model is None):
            raise ValueError("pass exactly one of model_path or model")
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if model is None:
            assert model_path is not None
            target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            load_dtype: torch.dtype | str = dtype or (torch.float32 if target.type == "cpu" else "auto")
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=load_dtype)
            torch.nn.Module.to(model, target)  # transformers types its own `to` oddly
        else:
            # A shared (colocated) model stays where the trainer put it unless told otherwise.
            moves: dict[str, Any] = {"device": device, "dtype": dtype}
            moves = {k: v for k, v in moves.items() if v is not None}
            if moves:
                model.to(**moves)
        assert model is not None
        model.eval()
        self._model = model
        self._device = next(model.parameters()).device
        self._num_layers = _attention_layer_count(model)
        self._vocab_size = int(cast(torch.Tensor, model.get_input_embeddings().weight).shape[0])
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        if max_context_length is None:
            text_config = model.config.get_text_config()
            max_context_length = getattr(text_config, "max_position_embeddings", None)
            if max_context_length is None:
                raise ValueError("the model config has no max_position_embeddings; pass max_context_length")
        self._max_context_length = int(max_context_length)
        self._max_batch_size = max_batch_size
        self._version = 0
        self._seed_rng = random.Random()

        # Shared between the event loop and the worker, guarded by _cv.
        self._cv = threading.Condition()
        self._pending: deque[_Request] = deque()
        self._commands: deque[_Command] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Worker-thread state.
        self._batch: _Batch | None = None

    # -- properties ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_length(self) -> int:
        return self._max_context_length

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def num_active(self) -> int:
        """Requests waiting or holding a batch row (finished and aborted ones leave at the next step)."""
        batch = self._batch
        return len(self._pending) + (len(batch) if batch is not None else 0)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        with self._cv:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._worker, name="rlgate-local-engine", daemon=True)
            self._thread.start()

    async def close(self) -> None:
        with self._cv:
            thread = self._thread
            if thread is None:
                return
            self._stopping = True
            self._cv.notify_all()
        await asyncio.to_thread(thread.join)
        with self._cv:
            if self._thread is thread:
                self._thread = None

    # -- generation ------------------------------------------------------------------------

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta]:
        self._validate(request)
        await self.start()
        sampling = request.sampling
        seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
        req = _Request(
            input_ids=list(request.input_ids),
            sampling=sampling,
            generator=torch.Generator().manual_seed(seed % 2**64),
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            stop_ids=frozenset(sampling.stop_token_ids),
        )
        with self._cv:
            if self._stopping:
                raise EngineError("the engine is shutting down", status=503, code="engine_unavailable")
            self._pending.append(req)
            self._cv.notify()
        try:
            while True:
                delta = _coalesce(await req.queue.get(), req.queue)
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            if not req.finished:
                req.aborted = True
                with self._cv:
                    self._cv.notify()

    def _validate(self, request: GenerateRequest) -> None:
        ids = request.input_ids
        if not ids:
            raise EngineError("input_ids is empty", status=400, code="invalid_request")
        if len(ids) >= self._max_context_length:
            raise EngineError(
                f"the prompt has {len(ids)} tokens; this engine's context is {self._max_context_length} "
                "tokens, prompt and output included",
                status=400,
                code="context_length_exceeded",
            )
        if min(ids) < 0 or max(ids) >= self._vocab_size:
            raise EngineError(
                f"input_ids must be in [0, {self._vocab_size})", status=400, code="invalid_request"
            )

    # -- weights ---------------------------------------------------------------------------

    async def update_weights_from_path(self, path: str | os.PathLike[str]) -> int:
        """Load a safetensors checkpoint directory into the model; return the new version."""
        state = await asyncio.to_thread(load_safetensors_dir, path)
        return await self.update_weights_from_state_dict(state)

    async def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Copy ``state_dict`` into the model between two decoding steps; return the new version."""
        pairs = match_state_dict(self._model, state_dict)

        def swap() -> int:
            with torch.no_grad():
                for target, source in pairs:
                    target.copy_(source)
            return self._bump()

        return await self._run_command(swap)

    async def bump_version(self) -> int:
        """Declare that the (shared) model was updated in place; return the new version."""
        return await self._run_command(self._bump)

    def _bump(self) -> int:
        self._version += 1
        return self._version

    async def _run_command(self, fn: Callable[[], int]) -> int:
        await self.start()
        loop = asyncio.get_running_loop()
        command = _Command(fn, loop, loop.create_future())
        with self._cv:
            if self._stopping:
                raise EngineError("the engine is shutting down", status=503, code="engine_unavailable")
            self._commands.append(command)
            self._cv.notify()
        return await command.future

    # -- worker thread ---------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not (self._stopping or self._commands or self._pending or self._batch is not None):
                    self._cv.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
                newcomers = self._admit()
            for command in commands:
                self._run(command)
            try:
                self._step(newcomers)
            except Exception as e:  # noqa: BLE001 - the engine thread keeps serving: fail what was in flight
                error = EngineError(f"generation failed: {type(e).__name__}: {e}", status=500)
                for req in [*newcomers, *(self._batch.rows if self._batch is not None else [])]:
                    req.finish_with(error)
                self._batch = None
        self._shutdown()

    def _admit(self) -> list[_Request]:
        """Pop pending requests that fit in the batch (caller holds the lock)."""
        free = self._max_batch_size - (len(self._batch) if self._batch is not None else 0)
        admitted: list[_Request] = []
        longest = 0
        while self._pending and len(admitted) < free:
            req = self._pending[0]
            if req.aborted:
                self._pending.popleft()
                continue
            longest_if_added = max(longest, len(req.input_ids))
            if admitted and longest_if_added * (len(admitted) + 1) > _PREFILL_TOKEN_BUDGET:
                break
            admitted.append(self._pending.popleft())
            longest = longest_if_added
        return admitted

    def _run(self, command: _Command) -> None:
        try:
            command.resolve(command.fn())
        except Exception as e:  # noqa: BLE001 - any failure of a command goes back to its caller
            if not isinstance(e, EngineError):
                e = WeightUpdateError(f"weight update failed: {type(e).__name__}: {e}", status=500)
            command.resolve(error=e)

    def _step(self, newcomers: list[_Request]) -> None:
        """Admit ``newcomers``, then run one decoding step over the whole batch."""
        self._drop_done()
        with torch.inference_mode():
            if newcomers:
                fresh, logits = self._prefill(newcomers)
                self._emit(fresh, logits)
                if self._batch is None:
                    self._batch = fresh
                else:
                    self._batch.extend(fresh)
                self._drop_done()
            if self._batch is not None:
                self._emit(self._batch, self._decode(self._batch))
                self._drop_done()

    def _prefill(self, reqs: list[_Request]) -> tuple[_Batch, torch.Tensor]:
        """Run the prompts of ``reqs`` (left padded) through the model; return the batch and last logits."""
        length = max(len(r.input_ids) for r in reqs)
        ids = torch.zeros(len(reqs), length, dtype=torch.long)
        mask = torch.zeros(len(reqs), length, dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, length - len(r.input_ids) :] = torch.tensor(r.input_ids)
            mask[i, length - len(r.input_ids) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = _PaddedCache(self._num_layers)
        logits = self._forward(ids, mask, positions, cache)
        batch = _Batch(reqs, cache, mask, positions[:, -1] + 1, [])
        return batch, logits

    def _decode(self, batch: _Batch) -> torch.Tensor:
        """Feed each row its last sampled token; return the next-token logits."""
        ids = torch.tensor(batch.next_tokens, dtype=torch.long, device=self._device)[:, None]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch), 1)], dim=1)
        logits = self._forward(ids, batch.mask, batch.positions[:, None], batch.cache)
        batch.positions = batch.positions + 1
        return logits

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: _PaddedCache
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._takes_logits_to_keep else {}
        out = self._model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, **kwargs
        )
        return out.logits[:, -1, :].float().cpu()

    def _emit(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Sample each row's next token, send it to its consumer, remember it for the next step."""
        tokens, logprobs = sample_tokens(
            logits, [r.sampling for r in batch.rows], [r.generator for r in batch.rows]
        )
        version = self._version
        for req, tok, lp in zip(batch.rows, tokens, logprobs, strict=False):
            if req.done:
                continue
            req.num_generated += 1
            finish = self._finish_reason(req, tok)
            req.finished = finish is not None
            req.push(TokenDelta([tok], [lp], [version], finish))
        batch.next_tokens = tokens

    def _finish_reason(self, req: _Request, token: int) -> FinishReason | None:
        if token in req.stop_ids:
            return "stop"
        if req.num_generated >= req.sampling.max_new_tokens:
            return "length"
        if len(req.input_ids) + req.num_generated >= self._max_context_length:
            return "length"
        return None

    def _drop_done(self) -> None:
        batch = self._batch
        if batch is None:
            return
        keep = [i for i, r in enumerate(batch.rows) if not r.done]
        if not keep:
            self._batch = None
        elif len(keep) < len(batch):
            batch.select(keep)

    def _shutdown(self) -> None:
        """Abort everything still in flight (worker thread, on close)."""
        with self._cv:
            pending = list(self._pending)
            self._pending.clear()
            commands = list(self._commands)
            self._commands.clear()
        running = self._batch.rows if self._batch is not None else []
        self._batch = None
        for req in [*running, *pending]:
            req.finish_with(TokenDelta([], [], [], "abort"))
        for command in commands:
            command.resolve(error=EngineError("the engine was closed", status=503, code="engine_unavailable"))


def _attention_layer_count(model: torch.nn.Module) -> int:
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


def _coalesce(
    first: TokenDelta | BaseException, queue: asyncio.Queue[TokenDelta | BaseException]
) -> TokenDelta:
    """Merge ``first`` with every delta already waiting in ``queue``."""
    if isinstance(first, BaseException):
        raise first
    ids, lps, vers = list(first.token_ids), list(first.logprobs), list(first.versions)
    finish = first.finish_reason
    while finish is None and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, BaseException):
            raise item
        ids += item.token_ids
        lps += item.logprobs
        vers += item.versions
        finish = item.finish_reason
    return TokenDelta(ids, lps, vers, finish)
