"""The remote engine: generation over HTTP, shared by the SGLang and vLLM engines.

:class:`RemoteEngine` streams a request from the backend its session is pinned to
(:mod:`.pool`), validates every event (:mod:`.wire`) and tags tokens with weight
versions; :mod:`.weights` keeps the backends on the current weights. A subclass speaks one
server kind: it builds the request body (:meth:`RemoteEngine.payload`), parses one
streamed event (:meth:`RemoteEngine.parse_event`) and implements the weight protocol
(:class:`~rlgate.engine.remote.backend.BackendHooks`).

Errors
------
``EngineError.status``: **503** backend unavailable (unreachable, down, draining, no
eligible backend, or it went away mid-stream); **502** the backend answered something
rlgate cannot trust (non-JSON, missing or inconsistent logprobs / token ids, truncated
or reset stream while the backend is still up, backend-side failure); **504** the
backend stopped sending for ``read_timeout`` seconds; **400** the backend refused the
request. Nothing malformed is ever yielded: every event is validated before its tokens
are passed on, and a stream that fails part-way fails the whole interaction (it is
recorded as failed and never exported).

(Past ~500 lines on purpose: the stream loop and its error mapping, retry and resume-after-pause
paths share one request's state; the wire parsing, pool and weight protocol already live apart.)

Weight updates that clients never notice
----------------------------------------
During an update (and between :meth:`RemoteEngine.pause_generation` and
:meth:`RemoteEngine.continue_generation`, the cluster barrier) new requests wait at the
engine's door, and each backend pauses the requests it is running in its own way (the server
kind's ``pause_mode``): SGLang ``retract`` / ``in_place`` and vLLM ``keep`` hold them and
continue them after the update; vLLM ``wait`` lets them finish first; SGLang and vLLM
``abort`` abort them. An aborted request is **resumed from its prefix**: once generation
continues, the engine sends prompt + the tokens already passed on as a new request (with the
remaining ``max_new_tokens``) and goes on with the same stream, so the caller sees one
uninterrupted generation, never an ``abort``. An abort that no pause caused is a backend
failure (503).

Versions
--------
Tokens are tagged with the gateway's weight version current when their event arrived.
During an update, generation is paused on every backend before any of them loads new
weights and resumed only after the version is bumped, so an event that arrives before
the bump was produced by the old weights. Server kinds whose pause ends or aborts every
request in flight before weights change (``tags_by_start``: vLLM ``wait`` and ``abort``) tag
every token of a request with the version current when it was sent, which is exact however
late its events are read. SGLang also labels each event with its
``weight_version``; when the label is known the engine uses it, and a label that does
not belong to the current weights fails the request (nothing mixes versions silently).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from rlgate.engine.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    StreamingEngineMixin,
    TokenDelta,
)
from rlgate.engine.remote.adapters import RemoteAdapters
from rlgate.engine.remote.backend import Backend
from rlgate.engine.remote.errors import (
    BackendAborted,
    BackendRejected,
    BackendUnreachable,
    MalformedResponse,
    describe_exc,
    error_text,
)
from rlgate.engine.remote.options import RemoteOptions
from rlgate.engine.remote.pool import BackendPool, Failover
from rlgate.engine.remote.weights import BackendWeights
from rlgate.engine.remote.wire import Chunk, StreamState, check_tokens, drain, sse_data
from rlgate.engine.weight_check import DEFAULT_TOLERANCE, WeightCheck, read_probe
from rlgate.engine.weights_path import checkpoint_dir

__all__ = ["MAX_RESUMES", "PROBE_TIMEOUT", "RemoteEngine"]

log = logging.getLogger("rlgate.engine.remote")

PROBE_TIMEOUT = 10.0  # seconds for info requests (model info, /v1/models, server info)
_UNKNOWN_CONTEXT = 1 << 30  # context length used until a backend reports its own
MAX_RESUMES = 16  # times one request may be aborted by weight updates and resumed from its prefix


class _AbortedByPause(Exception):
    """The backend aborted a request because generation was paused: resume it from its prefix."""


class RemoteEngine(RemoteAdapters, StreamingEngineMixin):
    """Base class of the SGLang and vLLM engines (see the module docstring)."""

    kind: ClassVar[str] = "remote"
    generate_path: ClassVar[str] = "/generate"
    health_path: ClassVar[str] = "/health"
    reports_labels: ClassVar[bool] = False  # does the server label its weights (SGLang's weight_version)?
    logprobs_mode: str = "scaled"  # what the reported logprobs are (see docs/remote-engines.md)

    def __init__(
        self,
        backend_urls: Iterable[str],
        *,
        max_context_length: int | None = None,
        failover: Failover = RemoteOptions.failover,
        health_interval: float = RemoteOptions.health_interval,
        health_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        read_timeout: float = RemoteOptions.backend_timeout,
        update_timeout: float = 1800.0,
        max_connections: int = RemoteOptions.backend_max_connections,
        api_key: str | None = RemoteOptions.backend_api_key,
        strict_logprobs: bool = RemoteOptions.strict_logprobs,
        weight_check_tolerance: float | None = DEFAULT_TOLERANCE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [u.rstrip("/") for u in backend_urls]
        if not urls:
            raise ValueError(f"{type(self).__name__} needs at least one backend URL")
        if len(set(urls)) != len(urls):
            raise ValueError("backend URLs must be distinct")
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"backend URL must start with http:// or https://: {u!r}")
        if failover not in ("fail", "move"):
            raise ValueError("failover must be 'fail' or 'move'")
        self.pool = BackendPool(
            urls, kind=self.kind, failover=failover, health_path=self.health_path,
            timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout, write=30.0, pool=30.0),
            max_connections=max_connections, headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            transport=transport,
        )
        self.weights = BackendWeights(self.pool, self, health_timeout=health_timeout, tolerance=weight_check_tolerance)
        self.health_interval = health_interval
        self.update_timeout = update_timeout
        self.strict_logprobs = strict_logprobs
        self._fallback_ctx = max_context_length
        self._ready: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._closed = False
        self._lora = {}  # LoRA adapters loaded on the backends (engine/remote/adapters.py)

    # ------------------------------------------------------------------ properties

    @property
    def version(self) -> int:
        return self.pool.version

    @property
    def backends(self) -> list[Backend]:
        return self.pool.backends

    @property
    def failover(self) -> Failover:
        return self.pool.failover

    @failover.setter
    def failover(self, value: Failover) -> None:
        self.pool.failover = value

    @property
    def max_context_length(self) -> int:
        known = [b.max_model_len for b in self.backends if b.max_model_len]
        if known:
            return min(known)
        if self._fallback_ctx is None:
            return _UNKNOWN_CONTEXT  # no backend answered yet and none was configured: the backends enforce it
        return self._fallback_ctx

    def backend_for(self, session_id: str) -> Backend | None:
        """The backend a session is pinned to (None if it has not been served yet)."""
        return self.pool.backend_for(session_id)

    def describe(self) -> dict[str, Any]:
        """Engine state for ``/health`` and logs."""
        return {
            "kind": self.kind,
            "weight_version": self.pool.version,
            "checkpoint": self.pool.path,
            "failover": self.failover,
            "logprobs": self.logprobs_mode,
            "backends": [b.describe() for b in self.backends],
            "weight_check": self.last_weight_check.describe() if self.last_weight_check is not None else None,
        }

    @property
    def last_weight_check(self) -> WeightCheck | None:
        """The outcome of the last weight update's check (engine/weight_check.py), if any ran."""
        return self.weights.last_check

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Probe every backend and start the health loop. Idempotent."""
        await self.ensure_ready()
        if self._health_task is None and self.health_interval > 0:
            self._health_task = asyncio.create_task(self.weights.health_loop(self.health_interval),
                                                    name=f"rlgate-{self.kind}-health")

    async def close(self) -> None:
        """Stop the health loop and close the connections; streams still running end with "abort"."""
        self._closed = True
        task, self._health_task = self._health_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # its end, not its outcome (a cancelled close still raises)
        await self.pool.close()

    async def ensure_ready(self) -> None:
        """Create clients and read each backend's model info once (no health loop)."""
        if self._ready is None or self._ready.get_loop() is not asyncio.get_running_loop():
            self._ready = asyncio.ensure_future(self._probe_all())
        if not self._ready.done():
            await asyncio.shield(self._ready)

    async def check_backends(self) -> None:
        """One round of health checks (the health loop calls this; tests may too)."""
        await self.weights.check_all()

    async def update_weights_from_path(self, path: str) -> int:
        """Load ``path`` on every eligible backend; bump the version only if all succeeded. The
        directory is checked first, here, as every engine checks it (engine/weights_path.py): it
        must be visible at the same path to the gateway and to the backends."""
        await asyncio.to_thread(checkpoint_dir, path)
        probe = await asyncio.to_thread(read_probe, path)
        await self.ensure_ready()
        return await self.weights.update(str(path), probe)

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe_safely(b) for b in self.backends))
        reachable = [b for b in self.backends if b.probed]
        if not reachable:
            log.error("%s engine: no backend reachable at start (%s); the health loop will admit them",
                      self.kind, ", ".join(b.url for b in self.backends))
        lens = {b.max_model_len for b in reachable if b.max_model_len}
        if len(lens) > 1:
            log.warning("backends report different context lengths %s; using the smallest", sorted(lens))
        paths = {b.model_path for b in reachable if b.model_path}
        if len(paths) > 1:
            log.warning("backends were launched from different checkpoints %s; all must serve the same weights",
                        sorted(paths))

    async def _probe_safely(self, b: Backend) -> None:
        try:
            await self.probe_backend(b)
            b.probed = True
        except (httpx.HTTPError, MalformedResponse, BackendRejected, OSError) as exc:
            b.set_state("down", f"probe failed: {describe_exc(exc)}")

    # ------------------------------------------------------------------ what a server kind implements

    def payload(self, b: Backend, request: GenerateRequest) -> dict[str, Any]:
        """The JSON body of the streaming generate request sent to ``b``."""
        raise NotImplementedError

    def parse_event(self, st: StreamState, obj: Any) -> Chunk | None:
        """Validate one decoded event; return the tokens it adds (None: nothing new)."""
        raise NotImplementedError

    async def probe_backend(self, b: Backend) -> None:
        """Read model info (context length, launch checkpoint, weight label) into ``b``."""
        raise NotImplementedError

    async def pause_backend(self, b: Backend) -> bool:
        """Pause generation for a weight update; False if the server has no pause."""
        return False

    async def resume_backend(self, b: Backend) -> None:
        """Resume generation after :meth:`pause_backend`."""

    async def load_weights(self, b: Backend, path: str, label: str) -> None:
        """Load the checkpoint at ``path``; raise WeightUpdateError (LoadRefused: kept its weights) or httpx errors."""
        raise NotImplementedError

    def label_for(self, version: int) -> str:
        """The label the server gets for the gateway's weight ``version``."""
        return str(version)

    async def score_backend(self, b: Backend, input_ids: list[int]) -> list[float]:
        """Teacher-forced ``log_softmax(logits)`` of ``input_ids[1:]`` on ``b`` (the weight check)."""
        raise NotImplementedError

    @property
    def tags_by_start(self) -> bool:
        """Does a pause end or abort every request in flight before weights change? (Then every
        token of a request was produced by the version current when it was sent.)"""
        return False

    # ------------------------------------------------------------------ pause (the cluster barrier)

    async def pause_generation(self) -> None:
        """Pause generation on every backend (the server kind's ``pause_mode``) until
        :meth:`continue_generation`; new requests wait. A weight update may run meanwhile."""
        await self.ensure_ready()
        await self.weights.pause_all()

    async def continue_generation(self) -> None:
        """Continue after :meth:`pause_generation`: held requests go on, aborted ones resume from their prefix."""
        await self.weights.resume_all()

    @property
    def paused(self) -> bool:
        return self.weights.pause.paused

    def restore_version(self, version: int) -> None:
        """Declare the weights the backends hold now to be ``version`` (a replica catching up after
        a restart, or one that missed updates)."""
        pool, old = self.pool, self.pool.version
        if version == old:
            return
        for b in pool.backends:
            if b.version == old:
                b.version = version
            for label, v in list(b.labels.items()):
                if v == old:
                    b.labels[label] = version
        pool.version = version

    # ------------------------------------------------------------------ generation

    def _validate(self, request: GenerateRequest) -> None:
        ids = request.input_ids
        if not ids:
            raise EngineError("input_ids is empty", status=400, code="invalid_request")
        ctx = self.max_context_length
        if len(ids) >= ctx:
            raise EngineError(
                f"the prompt has {len(ids)} tokens; this engine's context is {ctx} tokens, prompt and output "
                "included", status=400, code="context_length_exceeded")
        if self.strict_logprobs and not self.logprobs_follow_contract(request.sampling):
            s = request.sampling
            raise EngineError(
                f"the {self.kind} backends report {self.logprobs_mode} logprobs, which for temperature="
                f"{s.temperature:g}, top_p={s.top_p:g}, top_k={s.top_k} are not the distribution rlgate records "
                "(log_softmax(logits / T), untruncated); the gateway runs with --strict-logprobs",
                status=400, code="logprobs_unavailable")

    def logprobs_follow_contract(self, sampling: SamplingParams) -> bool:
        """Do the backend's reported logprobs follow ``engine/base.py``'s distribution for these params?"""
        greedy_or_t1 = sampling.temperature in (0.0, 1.0)
        if self.logprobs_mode == "raw":  # log_softmax(logits): the contract only at T = 1 (or greedy)
            return greedy_or_t1
        if self.logprobs_mode == "processed":  # after top-k/top-p renormalisation
            return sampling.top_p >= 1.0 and sampling.top_k <= 0
        return True

    def _headers_for(self, request: GenerateRequest) -> dict[str, str]:
        h: dict[str, str] = {}
        if request.request_id:
            h["X-Request-Id"] = request.request_id
        if request.session_id:
            h["X-Rlgate-Session"] = request.session_id
        return h

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        if self._closed:
            raise EngineError("the engine is shutting down", status=503, code="engine_unavailable")
        await self.ensure_ready()
        self._validate(request)
        self.check_adapter(request)
        produced: list[int] = []  # tokens passed on, over every attempt
        current, resumes = request, 0
        pause = self.weights.pause
        retried = False
        while True:
            await pause.wait()  # paused for a weight update: new work waits at the door
            b = self.pool.route(request.session_id)
            start_version, epoch = self.pool.version, pause.epoch
            b.in_flight += 1
            b.served += 1
            sent = False
            try:
                async for delta in self._stream_from(b, current, start_version, epoch, retry_stale=not retried):
                    sent = True
                    produced.extend(delta.token_ids)
                    yield delta
                return
            except _StaleConnection:
                # A pooled keep-alive connection the backend had just closed: the request never
                # reached it (no response started). Sent again once, on a fresh connection.
                retried = True
                continue
            except _AbortedByPause:
                resumes += 1
                if resumes > MAX_RESUMES:
                    raise EngineError(f"{self.kind} backend {b.url}: the request was aborted by {resumes} weight "
                                      "updates in a row", status=503, code="backend_unavailable") from None
                done = _finished(request, produced)
                if done is not None:
                    yield TokenDelta([], [], [], done)
                    return
                current = _continuation(request, produced, resumes)
                log.info("%s: request %s aborted by a weight update after %d tokens; resuming from its prefix",
                         self.kind, request.request_id or "-", len(produced))
            except BackendUnreachable:
                # Nothing reached the backend: with failover="move" the request (and its session)
                # moves to another backend; route() raises 503 once none is left.
                if self.failover != "move" or sent:
                    raise
            finally:
                b.in_flight -= 1

    async def _stream_from(self, b: Backend, request: GenerateRequest, start_version: int, epoch: int,
                           retry_stale: bool = False) -> AsyncGenerator[TokenDelta, None]:
        st = StreamState(request, b)
        responded = False
        try:
            async with self.pool.client(b).stream("POST", self.generate_path, json=self.payload(b, request),
                                                  headers=self._headers_for(request)) as resp:
                responded = True
                if resp.status_code != 200:
                    await resp.aread()
                    raise self._http_error(b, resp)
                events = sse_data(resp)
                async for data in events:
                    if data == b"[DONE]":
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError as exc:
                        raise MalformedResponse(f"an event is not JSON: {data[:200]!r}") from exc
                    chunk = self.parse_event(st, obj)
                    if chunk is None:
                        continue
                    check_tokens(chunk)
                    if not self.tags_by_start and epoch < self.weights.pause.epoch:  # it ran across an update
                        await self._after_check(b, epoch, len(st.ids))
                    st.ids.extend(chunk.token_ids)
                    if len(st.ids) > request.sampling.max_new_tokens:
                        raise MalformedResponse(f"{len(st.ids)} tokens generated; max_new_tokens was "
                                                f"{request.sampling.max_new_tokens}")
                    if chunk.token_ids or chunk.finish is not None:
                        v = (self.adapter_version(request.adapter) if request.adapter is not None else start_version
                             if self.tags_by_start else self._version_of(b, chunk.weight_label, start_version))
                        st.finished = chunk.finish is not None
                        yield TokenDelta(chunk.token_ids, chunk.logprobs, [v] * len(chunk.token_ids), chunk.finish)
                    if st.finished:
                        break
                if not st.finished:
                    raise MalformedResponse(f"the stream ended after {len(st.ids)} tokens without a finish reason "
                                            "(truncated response)")
                await drain(events)  # read the trailer ([DONE]) so the connection can be reused
        except MalformedResponse as exc:
            if st.finished:
                return
            raise EngineError(f"{self.kind} backend {b.url} sent a malformed response: {exc}", status=502,
                              code="bad_backend_response") from exc
        except BackendAborted as exc:
            if self.weights.pause.epoch != epoch:  # a pause since it was sent: the pause aborted it
                raise _AbortedByPause() from exc
            raise EngineError(f"{self.kind} backend {b.url} aborted the request after {len(st.ids)} tokens: "
                              f"{exc.message}", status=503, code="backend_unavailable") from exc
        except BackendRejected as exc:
            if exc.status in (429, 503):
                status = 503
            elif exc.status is not None and 400 <= exc.status < 500 and exc.status not in (401, 403, 404, 408):
                status = 400
            else:
                status = 502
            code = {400: "invalid_request", 503: "backend_unavailable"}.get(status, "backend_error")
            raise EngineError(f"{self.kind} backend {b.url} reported an error: {exc.message}", status=status,
                              code=code) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            b.set_state("down", f"unreachable: {describe_exc(exc)}")
            raise BackendUnreachable(f"{self.kind} backend {b.url} is unreachable ({describe_exc(exc)})",
                                     status=503, code="backend_unavailable") from exc
        except httpx.PoolTimeout as exc:
            raise EngineError(f"{self.kind} backend {b.url}: too many concurrent requests (connection pool "
                              "exhausted)", status=503, code="backend_unavailable") from exc
        except httpx.TimeoutException as exc:
            if st.finished:
                return
            raise EngineError(f"{self.kind} backend {b.url} sent nothing for {self.pool.timeout.read:g} s "
                              f"after {len(st.ids)} tokens", status=504, code="backend_timeout") from exc
        except httpx.HTTPError as exc:  # reset, peer closed mid-body, protocol violations
            if retry_stale and not responded and isinstance(exc, (httpx.ReadError, httpx.WriteError,
                                                                   httpx.RemoteProtocolError)):
                raise _StaleConnection from exc
            if st.finished:
                return  # the last event was already passed on; only the trailer was lost
            if self._closed:  # the gateway is shutting down: like the local engine, abort (keep the tokens)
                yield TokenDelta([], [], [], "abort")
                return
            if await self.pool.alive(b):
                raise EngineError(f"{self.kind} backend {b.url} broke the stream after {len(st.ids)} tokens "
                                  f"({describe_exc(exc)})", status=502, code="bad_backend_response") from exc
            b.set_state("down", f"went away mid-stream: {describe_exc(exc)}")
            raise EngineError(f"{self.kind} backend {b.url} went away after {len(st.ids)} tokens "
                              f"({describe_exc(exc)})", status=503, code="backend_unavailable") from exc

    async def _after_check(self, b: Backend, epoch: int, n: int) -> None:
        """An event of a request that was running when a weight update began: held back while that
        update's weight check runs; a failure if a check failed since the request was sent (its tokens
        may come from the rejected weights; engine/remote/verify.py)."""
        window = self.weights.window
        if window is not None and epoch < window.epoch:
            await window.verdict()
        if epoch < self.weights.rejected_epoch:
            raise EngineError(f"{self.kind} backend {b.url}: the request was running while weights that failed their "
                              f"check were served; its tokens after the first {n} may come from them", status=503,
                              code="backend_stale")

    def _version_of(self, b: Backend, label: str | None, start_version: int) -> int:
        if label is None or not b.labels:
            return self.pool.version
        v = b.labels.get(label)
        if v is None or v < start_version:
            what = "weights rlgate did not load" if v is None else f"stale weights (version {v})"
            b.dirty = True
            b.set_state("stale", f"serves {what}, labelled {label!r}")
            raise EngineError(
                f"{self.kind} backend {b.url} serves {what} (label {label!r}); the gateway is at version "
                f"{self.pool.version}. The backend is out of rotation until it is resynced", status=503,
                code="backend_stale")
        return v

    def _http_error(self, b: Backend, resp: httpx.Response) -> EngineError:
        code, text = resp.status_code, error_text(resp)
        where = f"{self.kind} backend {b.url}"
        if code in (401, 403):
            return EngineError(f"{where} refused rlgate's credentials (HTTP {code}: {text}); set --backend-api-key",
                               status=502, code="backend_error")
        if code == 404:
            return EngineError(f"{where} has no {self.generate_path} route (HTTP 404); is it a {self.kind} server?",
                               status=502, code="backend_error")
        if code in (429, 503):
            return EngineError(f"{where} is overloaded or unavailable (HTTP {code}: {text})", status=503,
                               code="backend_unavailable")
        if 400 <= code < 500:
            ctx = "context" in text.lower() and "length" in text.lower()
            return EngineError(f"{where} refused the request (HTTP {code}): {text}", status=400,
                               code="context_length_exceeded" if ctx else "invalid_request")
        return EngineError(f"{where} failed (HTTP {code}): {text}", status=502, code="backend_error")


class _StaleConnection(Exception):
    """The backend closed a reused connection before any response: safe to send the request again."""


def _finished(request: GenerateRequest, produced: list[int]) -> FinishReason | None:
    """The finish reason of a request aborted after ``produced`` tokens, if it had nothing left to do."""
    if produced and produced[-1] in request.sampling.stop_token_ids:
        return "stop"
    if len(produced) >= request.sampling.max_new_tokens:
        return "length"
    return None


def _continuation(request: GenerateRequest, produced: list[int], attempt: int) -> GenerateRequest:
    """The request that continues ``request`` after ``produced`` tokens: prompt + prefix, the tokens left."""
    sampling = dataclasses.replace(request.sampling, max_new_tokens=request.sampling.max_new_tokens - len(produced))
    rid = f"{request.request_id}-resume{attempt}" if request.request_id else ""
    return GenerateRequest(list(request.input_ids) + produced, sampling, request_id=rid, session_id=request.session_id,
                           adapter=request.adapter)


if TYPE_CHECKING:  # mypy checks that RemoteEngine has these capabilities (engine/capabilities.py)
    from rlgate.engine.base import Engine
    from rlgate.engine.capabilities import ChecksWeights, DescribesBackends, Pausable, ServesAdapters, VersionRestorable

    def _capabilities(engine: RemoteEngine) -> tuple[Engine, Pausable, VersionRestorable, DescribesBackends,
                                                     ChecksWeights, ServesAdapters]:
        return engine, engine, engine, engine, engine, engine
