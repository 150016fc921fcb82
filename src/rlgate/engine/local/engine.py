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
All running requests share one left-padded KV cache (:mod:`.cache`). Alongside the cache
the batch keeps a 2-D attention mask ``[B, S]`` (0 on padding) and, per row, the number of
real tokens seen so far, which is passed explicitly as ``position_ids``. A decoding step
feeds one token per row, so every row advances by exactly one column.

* **Joining.** Requests that arrive while a batch is decoding are prefilled together (left
  padded to the longest newcomer) before the next step, then merged into the running batch.
* **Leaving.** Finished and aborted rows are dropped with an index select; sequence
  columns that became padding in every remaining row are trimmed from the left.

Admission (:mod:`.admission`) is fair across sessions: one session holds at most
``max_rows_per_session`` rows, and free rows go round-robin to the sessions holding fewest.

Sampling (:mod:`.sampling`) draws each row's token from its own seeded generator, so a
seeded request produces the same tokens whatever else is in the batch.

Weight updates
--------------
A swap (:meth:`LocalEngine.update_weights_from_path`, ``..._from_state_dict``,
:meth:`LocalEngine.bump_version`) runs between two decoding steps. The rows in flight are then
**retracted**: their KV cache (computed by the old weights) is dropped and, before the next
token, prompt + tokens generated so far are prefilled again with the new weights. So every
token is produced entirely by the weights its version names, and a request in flight across
the update carries both versions (old ones first).

LoRA adapters (:mod:`.lora`, :meth:`LocalEngine.load_adapter`) sit on the base weights, held once;
a request names one (``GenerateRequest.adapter``) and its row gets that adapter's update in the same
forward as every other row. Loading or replacing an adapter retracts only that adapter's rows; its
tokens carry the adapter's version.

:meth:`LocalEngine.pause_generation` stops the worker between two steps (it returns once no
step is running: no token is produced until :meth:`LocalEngine.continue_generation`);
requests in flight keep their rows and new ones queue. Weight swaps still run while paused.
The cluster's weight-update barrier uses it: pause every replica, load everywhere, continue.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import inspect
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import AutoModelForCausalLM

from rlgate.engine.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    StreamingEngineMixin,
    TokenDelta,
    WeightUpdateError,
)
from rlgate.engine.local.adapters import AdapterCommands
from rlgate.engine.local.admission import admit_fairly
from rlgate.engine.local.batch import Batch, Command, RequestState, coalesce
from rlgate.engine.local.cache import PaddedCache, attention_layer_count
from rlgate.engine.local.lora import AdapterBank
from rlgate.engine.local.probe import checked_copy
from rlgate.engine.local.sampling import sample_tokens
from rlgate.engine.local.weights import load_safetensors_dir, match_state_dict
from rlgate.engine.options import EngineOptions
from rlgate.engine.weight_check import DEFAULT_TOLERANCE, WeightCheck, WeightCheckFailed, WeightProbe, read_probe

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["LocalEngine"]

log = logging.getLogger("rlgate.engine.local")

# Most padded tokens (rows x longest prompt) prefilled in one forward pass; at least one
# request is always admitted, however long its prompt.
PREFILL_TOKEN_BUDGET = 16384


class LocalEngine(AdapterCommands, StreamingEngineMixin):
    """Serve a Hugging Face causal LM in this process with continuous batching."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        model: PreTrainedModel | None = None,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        max_batch_size: int = EngineOptions.max_batch_size,
        max_context_length: int | None = None,
        max_rows_per_session: int | None = None,
        seed: int | None = None,
        threads: int | None = None,
        weight_check_tolerance: float | None = DEFAULT_TOLERANCE,
    ) -> None:
        """``seed``: a request without its own seed gets one made from this, its session and its prompt
        (never from arrival order), so a seeded run samples the same tokens whatever the concurrency.

        ``threads``: torch intra-op threads of the engine's forward passes (its worker thread only; the
        process's other threads keep theirs). ``None`` keeps torch's setting. An engine sharing a few
        cores with busy Python threads (an in-process gateway's server and agents) loses most of its
        time to OpenMP barriers when a core it waits for is taken; one thread fewer avoids that."""
        if (model_path is None) == (model is None):
            raise ValueError("pass exactly one of model_path or model")
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if threads is not None and threads < 1:
            raise ValueError("threads must be >= 1")
        self._threads = threads
        self.weight_check_tolerance = weight_check_tolerance  # None: checkpoints' probes are not checked
        self.last_weight_check: WeightCheck | None = None
        if model is None:
            target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            assert model_path is not None
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
        self._num_layers = attention_layer_count(model)
        self._vocab_size = int(cast(torch.Tensor, model.get_input_embeddings().weight).shape[0])
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        if max_context_length is None:
            text_config = model.config.get_text_config()
            max_context_length = getattr(text_config, "max_position_embeddings", None)
            if max_context_length is None:
                raise ValueError("the model config has no max_position_embeddings; pass max_context_length")
        self._max_context_length = int(max_context_length)
        self._max_batch_size = max_batch_size
        # one session cannot take the whole batch while others wait (default: half of it)
        self._max_rows_per_session = max_rows_per_session or max(1, max_batch_size // 2)
        self._version = 0
        self._adapters = AdapterBank(model)  # LoRA adapters: their weights and versions (worker thread)
        self._seed_rng = random.Random()
        self._run_seed = seed

        # Shared between the event loop and the worker, guarded by _cv.
        self._cv = threading.Condition()
        self._pending: deque[RequestState] = deque()
        self._commands: deque[Command] = deque()
        self._stopping = False
        self._paused = False  # pause_generation: no decoding step until continue_generation
        self._thread: threading.Thread | None = None
        self._thread_ready = threading.Event()  # the worker has set its torch threads (``threads``)
        # Worker-thread state.
        self._batch: Batch | None = None
        self._decode_steps = 0  # batched decoding steps run
        self._decode_rows = 0  # rows decoded, summed over steps (/ steps = mean batch size)
        self._prefill_passes = 0  # prefill forward passes run (a batch of joiners is one pass)
        self._prefill_rows = 0  # distinct sequences prefilled, summed over passes
        # Prefill identical sequences arriving together once (GRPO groups share their prompt).
        self.dedup_prefill = True
        # Called (worker thread) with the seconds a request waited for a batch row; the gateway
        # wires its queue-time histogram here. Must be cheap and thread-safe.
        self.on_queue_wait: Callable[[float], None] | None = None

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
    def paused(self) -> bool:
        return self._paused

    @property
    def num_active(self) -> int:
        """Requests waiting or holding a batch row (finished and aborted ones leave at the next step)."""
        batch = self._batch
        return len(self._pending) + (len(batch) if batch is not None else 0)

    @property
    def threads(self) -> int | None:
        """Torch threads of the engine's forward passes (None: torch's setting)."""
        return self._threads

    def stats(self) -> dict[str, int]:
        """Batch occupancy for metrics: running rows, waiting requests, capacity, decode counters
        (read without the lock: each value is a consistent int)."""
        batch = self._batch
        return {"running": len(batch) if batch is not None else 0, "waiting": len(self._pending),
                "max_batch_size": self._max_batch_size, "decode_steps": self._decode_steps,
                "decode_rows": self._decode_rows, "prefill_passes": self._prefill_passes,
                "prefill_rows": self._prefill_rows}

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        with self._cv:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._worker, name="rlgate-local-engine", daemon=True)
            if self._threads is None:
                self._thread.start()
                return
            # torch.set_num_threads sets the calling thread's OpenMP/MKL count *and* the default of the
            # threads that start using torch later: the worker sets its own, then this thread puts the
            # default back (its own count is unchanged: it is the value read here).
            ours = torch.get_num_threads()
            ready = threading.Event()
            self._thread_ready = ready
            self._thread.start()
        await asyncio.to_thread(ready.wait)
        torch.set_num_threads(ours)

    def _default_seed(self, request: GenerateRequest) -> int:
        if self._run_seed is None:
            return self._seed_rng.getrandbits(63)
        h = hashlib.blake2b(digest_size=8, key=str(self._run_seed).encode())
        h.update((request.session_id or "").encode() + b"\0")
        h.update(array.array("q", request.input_ids).tobytes())
        return int.from_bytes(h.digest(), "little") >> 1

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

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        self._validate(request)
        if request.adapter is not None and request.adapter not in self._adapters:
            raise EngineError(f"no adapter {request.adapter!r} is loaded", status=404, code="adapter_not_found")
        await self.start()
        sampling = request.sampling
        seed = sampling.seed if sampling.seed is not None else self._default_seed(request)
        req = RequestState(
            input_ids=list(request.input_ids),
            sampling=sampling,
            generator=torch.Generator().manual_seed(seed % 2**64),
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            stop_ids=frozenset(sampling.stop_token_ids),
            session_id=request.session_id,
            adapter=request.adapter,
        )
        with self._cv:
            if self._stopping:
                raise EngineError("the engine is shutting down", status=503, code="engine_unavailable")
            self._pending.append(req)
            self._cv.notify()
        try:
            while True:
                delta = coalesce(await req.queue.get(), req.queue)
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
        """Load a safetensors checkpoint directory into the model, checked against its probe if it has
        one (engine/weight_check.py); return the new version."""
        state = await asyncio.to_thread(load_safetensors_dir, path)
        probe = await asyncio.to_thread(read_probe, path)
        return await self.update_weights_from_state_dict(state, probe=probe, path=str(path))

    async def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor], *,
                                             probe: WeightProbe | None = None, path: str = "(in memory)") -> int:
        """Copy ``state_dict`` into the model between two decoding steps (and check it against
        ``probe``: a failure puts the previous weights back); return the new version."""
        pairs = match_state_dict(self._model, state_dict)

        def swap() -> int:
            try:
                self.last_weight_check = checked_copy(self._model, pairs, probe, path=path,
                                                      tolerance=self.weight_check_tolerance)
            except WeightCheckFailed as exc:
                self.last_weight_check = exc.check
                raise
            return self._bump()

        return await self._run_command(swap)

    async def bump_version(self) -> int:
        """Declare that the (shared) model was updated in place; return the new version."""
        return await self._run_command(self._bump)

    def _bump(self) -> int:
        """New weights are in place (worker thread, between steps): retract the rows in flight."""
        self._version += 1
        self._retract()
        return self._version

    def _retract(self, adapter: str | None = None, *, only: bool = False) -> None:
        """Drop the KV cache of the running rows (``only``: of ``adapter``'s rows); they are prefilled again
        (prompt + generated) first."""
        batch = self._batch
        if batch is None:
            return
        out = [i for i, r in enumerate(batch.rows) if not only or r.adapter == adapter]
        rows = [batch.rows[i] for i in out if not batch.rows[i].done]
        if len(out) == len(batch):
            self._batch = None
        elif out:
            batch.select([i for i in range(len(batch)) if i not in set(out)])
        with self._cv:
            self._pending.extendleft(reversed(rows))

    async def pause_generation(self) -> None:
        """Stop between two decoding steps; returns once no step runs (requests in flight wait)."""
        with self._cv:
            self._paused = True
        await self._run_command(lambda: self._version)  # runs between steps, after any step in progress

    async def continue_generation(self) -> None:
        """Resume decoding after :meth:`pause_generation` (requests continue where they stopped)."""
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    async def set_threads(self, threads: int) -> None:
        """Change the worker's torch threads (see ``threads``) between two steps."""
        if threads < 1:
            raise ValueError("threads must be >= 1")
        ours = torch.get_num_threads()

        def apply() -> int:
            torch.set_num_threads(threads)
            return threads

        await self._run_command(apply)
        torch.set_num_threads(ours)  # the default of threads yet to use torch, as in start()
        self._threads = threads

    def restore_version(self, version: int) -> None:
        """Declare the weights loaded now to be ``version`` (a replica catching up after a restart)."""
        self._version = version

    async def _run_command(self, fn: Callable[[], int]) -> int:
        await self.start()
        loop = asyncio.get_running_loop()
        command = Command(fn, loop, loop.create_future())
        with self._cv:
            if self._stopping:
                raise EngineError("the engine is shutting down", status=503, code="engine_unavailable")
            self._commands.append(command)
            self._cv.notify()
        return await command.future

    # -- worker thread ---------------------------------------------------------------------

    def _worker(self) -> None:
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            torch.get_num_threads()  # initialises this thread's count now, before the default is put back
            self._thread_ready.set()
        while True:
            with self._cv:
                while not (self._stopping or self._commands
                           or (not self._paused and (self._pending or self._batch is not None))):
                    self._cv.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
                paused = self._paused  # decided with the commands: a pause's own command sees it
                newcomers = [] if paused else self._admit()
            for command in commands:
                self._run(command)
            if paused:
                continue
            try:
                self._step(newcomers)
            except Exception as e:  # keep serving: fail what was in flight, start afresh
                log.exception("local engine: a generation step failed; failing the requests in flight")
                error = EngineError(f"generation failed: {type(e).__name__}: {e}", status=500)
                for req in [*newcomers, *(self._batch.rows if self._batch is not None else [])]:
                    req.finish_with(error)
                self._batch = None
        self._shutdown()

    def _admit(self) -> list[RequestState]:
        """Pop pending requests that fit in the batch, fairly across sessions (caller holds the lock)."""
        running = self._batch.rows if self._batch is not None else []
        free = self._max_batch_size - len(running)
        if free <= 0 or not self._pending:
            return []
        admitted = admit_fairly(self._pending, running, free, self._max_rows_per_session, PREFILL_TOKEN_BUDGET)
        if admitted and self.on_queue_wait is not None:
            now = time.perf_counter()
            for req in admitted:
                if not req.num_generated:  # a row retracted by a weight update is not a new wait
                    self.on_queue_wait(now - req.queued_at)
        return admitted

    def _run(self, command: Command) -> None:
        try:
            result = command.fn()
        except EngineError as e:
            command.fail(e)
        except Exception as e:  # a failed copy must not kill the worker: report it to the caller
            log.exception("local engine: a weight update failed")
            command.fail(WeightUpdateError(f"weight update failed: {type(e).__name__}: {e}", status=500))
        else:
            command.resolve(result)

    def _step(self, newcomers: list[RequestState]) -> None:
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
                self._decode_steps += 1
                self._decode_rows += len(self._batch)
                self._emit(self._batch, self._decode(self._batch))
                self._drop_done()

    def _prefill(self, reqs: list[RequestState]) -> tuple[Batch, torch.Tensor]:
        """Run the sequences of ``reqs`` (left padded) through the model; return the batch and last logits.

        Identical sequences (a GRPO group: the same prompt sampled n times) are run once and their
        cache rows copied, when ``dedup_prefill`` is on."""
        # prompt (+ the tokens generated so far for a retracted row), and the adapter that reads it
        seqs = [(r.adapter, tuple(r.sequence)) for r in reqs]
        where: dict[tuple[str | None, tuple[int, ...]], int] = {}
        rows = [where.setdefault(q, len(where)) for q in seqs] if self.dedup_prefill else list(range(len(seqs)))
        keys = list(where) if self.dedup_prefill else seqs
        unique = [q for _, q in keys]
        length = max(len(q) for q in unique)
        ids = torch.zeros(len(unique), length, dtype=torch.long)
        mask = torch.zeros(len(unique), length, dtype=torch.long)
        for i, q in enumerate(unique):
            ids[i, length - len(q) :] = torch.tensor(q)
            mask[i, length - len(q) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = PaddedCache(self._num_layers)
        self._prefill_passes += 1
        self._prefill_rows += len(unique)
        logits = self._forward(ids, mask, positions, cache, [a for a, _ in keys])
        if len(unique) < len(reqs):  # one cache row (a copy) and one logits row per request
            idx = torch.tensor(rows, dtype=torch.long, device=self._device)
            cache.select_rows(idx)
            mask, positions, logits = mask[idx], positions[idx], logits[idx.to(logits.device)]
        batch = Batch(reqs, cache, mask, positions[:, -1] + 1, [])
        return batch, logits

    def _decode(self, batch: Batch) -> torch.Tensor:
        """Feed each row its last sampled token; return the next-token logits."""
        ids = torch.tensor(batch.next_tokens, dtype=torch.long, device=self._device)[:, None]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch), 1)], dim=1)
        logits = self._forward(ids, batch.mask, batch.positions[:, None], batch.cache, [r.adapter for r in batch.rows])
        batch.positions = batch.positions + 1
        return logits

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: PaddedCache,
                 adapters: list[str | None]) -> torch.Tensor:
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._takes_logits_to_keep else {}
        with self._adapters.plan(adapters):  # each row's LoRA adapter, if any
            out = self._model(
                input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, **kwargs
            )
        return out.logits[:, -1, :].float().cpu()

    def _emit(self, batch: Batch, logits: torch.Tensor) -> None:
        """Sample each row's next token, send it to its consumer, remember it for the next step."""
        tokens, logprobs = sample_tokens(
            logits, [r.sampling for r in batch.rows], [r.generator for r in batch.rows]
        )
        for req, tok, lp in zip(batch.rows, tokens, logprobs, strict=True):
            if req.done:
                continue
            req.generated.append(tok)
            finish = self._finish_reason(req, tok)
            req.finished = finish is not None
            version = self._version if req.adapter is None else self._adapters.version(req.adapter)
            req.push(TokenDelta([tok], [lp], [version], finish))
        batch.next_tokens = tokens

    def _finish_reason(self, req: RequestState, token: int) -> FinishReason | None:
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
            command.fail(EngineError("the engine was closed", status=503, code="engine_unavailable"))


if TYPE_CHECKING:  # mypy checks that LocalEngine has these capabilities (engine/capabilities.py)
    from rlgate.engine.base import Engine
    from rlgate.engine.capabilities import (
        ChecksWeights,
        HasModel,
        HasStats,
        LoadsStateDict,
        Pausable,
        QueueWaitObservable,
        ServesAdapters,
        VersionRestorable,
    )

    def _capabilities(engine: LocalEngine) -> tuple[Engine, Pausable, VersionRestorable, HasStats,
                                                    QueueWaitObservable, HasModel, ChecksWeights,
                                                    ServesAdapters, LoadsStateDict]:
        return engine, engine, engine, engine, engine, engine, engine, engine, engine
