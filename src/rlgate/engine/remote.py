"""Remote engines: inference servers (SGLang, vLLM) driven over HTTP, token-in/token-out.

:class:`RemoteEngine` holds what the SGLang and vLLM engines share; the two subclasses
(``engine/sglang.py``, ``engine/vllm.py``) only build the request body, parse one
streamed event and speak each server's weight-update protocol.

Several backends at once
------------------------
* **Affinity.** The first request of a session goes to the least-loaded eligible backend
  (fewest requests in flight, then fewest pinned sessions); every later request of that
  session goes to the same backend, so its prefix cache is reused turn after turn.
* **Health.** ``start()`` runs a health loop (``GET /health`` every ``health_interval``
  seconds). A backend that fails a check, refuses a connection, or vanishes mid-stream
  is taken out of rotation: it gets no new sessions, and requests of sessions pinned to
  it answer **503** (``failover="fail"``, the default) or move to another backend
  (``failover="move"``, see below). It rejoins after a successful check, once its
  weights are known to be the current version (resynced from the current checkpoint
  if needed).
* **Moving a session is token-exact.** rlgate sends the whole prompt as token ids on
  every turn and keeps no state on the backend, so a turn served by another backend
  holding the same weight version continues the same token sequence; only the prefix
  cache is lost. ``failover="move"`` enables it; the default answers 503 so that an
  operator sees the outage.
* **Weights.** ``update_weights_from_path`` pauses every eligible backend, loads the
  checkpoint on all of them, and bumps the version only if every one succeeded. On a
  partial failure every backend that loaded it, or failed part-way, is rolled back to
  the previous checkpoint (one that refused it kept its weights); a backend whose
  rollback fails, or whose previous checkpoint is unknown, is quarantined (``stale``: no
  traffic) until a later update or a health-loop resync brings it to the current version.
  Generation resumes in every case. A backend that is down during an update is resynced
  before it rejoins. So a backend serves traffic only
  while it holds the gateway's current version.

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

Versions
--------
Tokens are tagged with the gateway's weight version current when their event arrived.
During an update, generation is paused on every backend before any of them loads new
weights and resumed only after the version is bumped, so an event that arrives before
the bump was produced by the old weights. SGLang also labels each event with its
``weight_version``; when the label is known the engine uses it, and a label that does
not belong to the current weights fails the request (nothing mixes versions silently).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import httpx

from rlgate.engine.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    StreamingEngineMixin,
    TokenDelta,
    WeightUpdateError,
)

log = logging.getLogger("rlgate.engine.remote")

Failover = Literal["fail", "move"]
BackendState = Literal["healthy", "down", "stale"]

_MAX_ERROR_BODY = 2000  # characters of a backend error body kept in messages
PROBE_TIMEOUT = 10.0  # seconds for info requests (model info, /v1/models, server info)
_POOL_SHARD = 16  # connections per httpx pool (see RemoteEngine._client)
_UNKNOWN_CONTEXT = 1 << 30  # context length used until a backend reports its own
_MAX_AFFINITY = 200_000  # pinned sessions remembered (least recently used are forgotten)


class MalformedResponse(Exception):
    """A backend answer rlgate cannot trust (mapped to a 502)."""


class BackendRejected(Exception):
    """The backend answered an event that reports an error (``{"error": ...}``)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class BackendUnreachable(EngineError):
    """No connection to the backend could be made (nothing was sent)."""


class LoadRefused(WeightUpdateError):
    """The backend refused a checkpoint and still serves its previous weights."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=502)


@dataclass
class Chunk:
    """One parsed event: the tokens it adds, and the finish reason if it is the last."""

    token_ids: list[int]
    logprobs: list[float]
    finish: FinishReason | None = None
    weight_label: str | None = None  # the backend's own label for its weights (SGLang)


@dataclass(eq=False)
class Backend:
    """One inference server and what the engine knows about it."""

    url: str
    index: int
    state: BackendState = "healthy"
    reason: str = ""  # why it is not healthy
    version: int = 0  # gateway weight version these weights correspond to
    labels: dict[str, int] = field(default_factory=dict)  # backend weight label -> gateway version
    label: str | None = None  # the backend's current label for its weights, when it reports one
    model_path: str | None = None  # checkpoint the server was launched with (rollback target at v0)
    max_model_len: int | None = None
    in_flight: int = 0  # requests streaming now
    sessions: int = 0  # sessions pinned to it
    served: int = 0  # requests started, ever
    probed: bool = False
    dirty: bool = False  # its weights may not be what ``version`` says: reload before it serves again
    changed_at: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)  # engine-specific facts (served model name, ...)
    clients: list[httpx.AsyncClient] = field(default_factory=list)  # connection pool shards
    turn: int = 0
    loop: asyncio.AbstractEventLoop | None = None

    def set_state(self, state: BackendState, reason: str = "") -> None:
        if state != self.state:
            log.warning("backend %s: %s -> %s%s", self.url, self.state, state, f" ({reason})" if reason else "")
            self.changed_at = time.time()
        self.state = state
        self.reason = reason

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "state": self.state,
            "reason": self.reason or None,
            "weight_version": self.version,
            "weight_label": self.label,
            "in_flight": self.in_flight,
            "sessions": self.sessions,
            "requests": self.served,
            "max_model_len": self.max_model_len,
        }


@dataclass
class _StreamState:
    """Per-request parsing state."""

    request: GenerateRequest
    backend: Backend
    ids: list[int] = field(default_factory=list)  # tokens passed on so far
    finished: bool = False


class RemoteEngine(StreamingEngineMixin):
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
        failover: Failover = "fail",
        health_interval: float = 5.0,
        health_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        read_timeout: float = 300.0,
        update_timeout: float = 1800.0,
        max_connections: int = 512,
        api_key: str | None = None,
        strict_logprobs: bool = False,
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
        self.backends = [Backend(u, i) for i, u in enumerate(urls)]
        self.failover: Failover = failover
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.update_timeout = update_timeout
        self.strict_logprobs = strict_logprobs
        self._fallback_ctx = max_context_length
        self._timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=30.0, pool=30.0)
        self._limits = httpx.Limits(max_connections=max_connections)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport = transport
        self._version = 0
        self._path: str | None = None  # checkpoint of the current version (None: launch weights)
        self._affinity: OrderedDict[str, Backend] = OrderedDict()
        self._update_lock: asyncio.Lock | None = None
        self._ready: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ properties

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_length(self) -> int:
        known = [b.max_model_len for b in self.backends if b.max_model_len]
        if known:
            return min(known)
        if self._fallback_ctx is None:
            return _UNKNOWN_CONTEXT  # no backend answered yet and none was configured: the backends enforce it
        return self._fallback_ctx

    def describe(self) -> dict[str, Any]:
        """Engine state for ``/health`` and logs."""
        return {
            "kind": self.kind,
            "weight_version": self._version,
            "checkpoint": self._path,
            "failover": self.failover,
            "logprobs": self.logprobs_mode,
            "backends": [b.describe() for b in self.backends],
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Probe every backend and start the health loop. Idempotent."""
        await self._ensure_ready()
        if self._health_task is None and self.health_interval > 0:
            self._health_task = asyncio.create_task(self._health_loop(), name=f"rlgate-{self.kind}-health")

    async def close(self) -> None:
        """Stop the health loop and close the connections; streams still running end with "abort"."""
        self._closed = True
        task, self._health_task = self._health_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for b in self.backends:
            clients, b.clients = b.clients, []
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _ensure_ready(self) -> None:
        """Create clients and read each backend's model info once (no health loop)."""
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        if self._ready is None or self._ready.get_loop() is not asyncio.get_running_loop():
            self._ready = asyncio.ensure_future(self._probe_all())
        if not self._ready.done():
            await asyncio.shield(self._ready)

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
            await self._probe(b)
            b.probed = True
        except (httpx.HTTPError, MalformedResponse, BackendRejected, OSError) as exc:
            b.set_state("down", f"probe failed: {_describe_exc(exc)}")

    # ------------------------------------------------------------------ HTTP plumbing

    def _client(self, b: Backend) -> httpx.AsyncClient:
        """A client for ``b``: one of several small connection pools, used in turn.

        httpcore's pool scans all of its connections (and polls every idle socket) whenever a
        request starts or ends, so one pool of hundreds of connections costs milliseconds per
        request under load; shards of ``_POOL_SHARD`` connections keep that scan short.
        """
        loop = asyncio.get_running_loop()
        if not b.clients or b.loop is not loop:
            n = max(1, -(-self._limits.max_connections // _POOL_SHARD))  # type: ignore[operator]
            per = max(1, -(-self._limits.max_connections // n))  # type: ignore[operator]
            limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
            b.clients = [httpx.AsyncClient(base_url=b.url, timeout=self._timeout, limits=limits,
                                           headers=self._headers, transport=self._transport) for _ in range(n)]
            b.loop = loop
        b.turn += 1
        return b.clients[b.turn % len(b.clients)]

    async def _call(self, b: Backend, method: str, path: str, *, json_body: Any = None,
                    params: dict[str, Any] | None = None, timeout: float | None = None) -> httpx.Response:
        kw: dict[str, Any] = {}
        if json_body is not None:
            kw["json"] = json_body
        if params:
            kw["params"] = params
        if timeout is not None:
            kw["timeout"] = httpx.Timeout(timeout, connect=self._timeout.connect)
        return await self._client(b).request(method, path, **kw)

    async def _get_json(self, b: Backend, path: str, *, timeout: float | None = None) -> Any:
        r = await self._call(b, "GET", path, timeout=timeout)
        if r.status_code != 200:
            raise BackendRejected(f"GET {path} -> HTTP {r.status_code}: {_error_text(r)}", r.status_code)
        try:
            return r.json()
        except ValueError as exc:
            raise MalformedResponse(f"GET {path} returned non-JSON: {r.text[:200]!r}") from exc

    # ------------------------------------------------------------------ subclass hooks

    async def _probe(self, b: Backend) -> None:
        """Read model info (context length, launch checkpoint, weight label)."""
        raise NotImplementedError

    def _payload(self, b: Backend, request: GenerateRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _parse_event(self, st: _StreamState, obj: Any) -> Chunk | None:
        """Validate one decoded event; return the tokens it adds (None: nothing new)."""
        raise NotImplementedError

    async def _pause(self, b: Backend) -> bool:
        """Pause generation for a weight update; False if the server has no pause."""
        return False

    async def _resume(self, b: Backend) -> None:
        pass

    async def _load(self, b: Backend, path: str, label: str) -> None:
        """Load the checkpoint at ``path``; raise WeightUpdateError (refused) or httpx errors."""
        raise NotImplementedError

    async def _current_label(self, b: Backend) -> str | None:
        """The backend's own label for the weights it serves now, when it reports one."""
        return None

    # ------------------------------------------------------------------ routing

    def _eligible(self, b: Backend) -> bool:
        return b.state == "healthy" and b.version == self._version

    def _least_loaded(self) -> Backend:
        ok = [b for b in self.backends if self._eligible(b)]
        if not ok:
            states = "; ".join(f"{b.url}: {b.state}{' (' + b.reason + ')' if b.reason else ''}"
                               for b in self.backends)
            raise EngineError(f"no {self.kind} backend is available ({states})", status=503,
                              code="backend_unavailable")
        return min(ok, key=lambda b: (b.in_flight, b.sessions, b.served, b.index))

    def _pin(self, session_id: str, b: Backend) -> None:
        old = self._affinity.pop(session_id, None)
        if old is not None:
            old.sessions -= 1
        self._affinity[session_id] = b
        b.sessions += 1
        while len(self._affinity) > _MAX_AFFINITY:
            _, evicted = self._affinity.popitem(last=False)
            evicted.sessions -= 1

    def backend_for(self, session_id: str) -> Backend | None:
        """The backend a session is pinned to (None if it has not been served yet)."""
        return self._affinity.get(session_id)

    def _route(self, session_id: str | None) -> Backend:
        if session_id is None:
            return self._least_loaded()
        b = self._affinity.get(session_id)
        if b is None:
            b = self._least_loaded()
            self._pin(session_id, b)
            return b
        self._affinity.move_to_end(session_id)
        if self._eligible(b):
            return b
        why = b.reason or ("its weights are not the current version" if b.state == "healthy" else b.state)
        if self.failover == "fail":
            raise EngineError(
                f"session {session_id!r} is pinned to {self.kind} backend {b.url}, which is unavailable ({why}); "
                "its requests fail until the backend is healthy again (start the gateway with --failover move "
                "to move such sessions to another backend)",
                status=503, code="backend_unavailable",
            )
        nb = self._least_loaded()
        log.warning("session %s: moving from %s (%s) to %s", session_id, b.url, why, nb.url)
        self._pin(session_id, nb)
        return nb

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

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta]:
        if self._closed:
            raise EngineError("the engine is shutting down", status=503, code="engine_unavailable")
        await self._ensure_ready()
        self._validate(request)
        while True:
            b = self._route(request.session_id)
            start_version = self._version
            b.in_flight += 1
            b.served += 1
            sent = False
            try:
                async for delta in self._stream_from(b, request, start_version):
                    sent = True
                    yield delta
                return
            except BackendUnreachable:
                # Nothing reached the backend: with failover="move" the request (and its session)
                # moves to another backend; _route raises 503 once none is left.
                if self.failover != "move" or sent:
                    raise
            finally:
                b.in_flight -= 1

    async def _stream_from(self, b: Backend, request: GenerateRequest, start_version: int
                           ) -> AsyncIterator[TokenDelta]:
        st = _StreamState(request, b)
        try:
            async with self._client(b).stream("POST", self.generate_path, json=self._payload(b, request),
                                              headers=self._headers_for(request)) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise self._http_error(b, resp)
                events = _sse_data(resp)
                async for data in events:
                    if data == b"[DONE]":
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError as exc:
                        raise MalformedResponse(f"an event is not JSON: {data[:200]!r}") from exc
                    chunk = self._parse_event(st, obj)
                    if chunk is None:
                        continue
                    _check_tokens(chunk)
                    st.ids.extend(chunk.token_ids)
                    if len(st.ids) > request.sampling.max_new_tokens:
                        raise MalformedResponse(f"{len(st.ids)} tokens generated; max_new_tokens was "
                                                f"{request.sampling.max_new_tokens}")
                    if chunk.token_ids or chunk.finish is not None:
                        v = self._version_of(b, chunk.weight_label, start_version)
                        st.finished = chunk.finish is not None
                        yield TokenDelta(chunk.token_ids, chunk.logprobs, [v] * len(chunk.token_ids), chunk.finish)
                    if st.finished:
                        break
                if not st.finished:
                    raise MalformedResponse(f"the stream ended after {len(st.ids)} tokens without a finish reason "
                                            "(truncated response)")
                await _drain(events)  # read the trailer ([DONE]) so the connection can be reused
        except MalformedResponse as exc:
            if st.finished:
                return
            raise EngineError(f"{self.kind} backend {b.url} sent a malformed response: {exc}", status=502,
                              code="bad_backend_response") from exc
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
            b.set_state("down", f"unreachable: {_describe_exc(exc)}")
            raise BackendUnreachable(f"{self.kind} backend {b.url} is unreachable ({_describe_exc(exc)})",
                                     status=503, code="backend_unavailable") from exc
        except httpx.PoolTimeout as exc:
            raise EngineError(f"{self.kind} backend {b.url}: too many concurrent requests (connection pool "
                              "exhausted)", status=503, code="backend_unavailable") from exc
        except httpx.TimeoutException as exc:
            if st.finished:
                return
            raise EngineError(f"{self.kind} backend {b.url} sent nothing for {self._timeout.read:g} s "
                              f"after {len(st.ids)} tokens", status=504, code="backend_timeout") from exc
        except httpx.HTTPError as exc:  # reset, peer closed mid-body, protocol violations
            if st.finished:
                return  # the last event was already passed on; only the trailer was lost
            if self._closed:  # the gateway is shutting down: like the local engine, abort (keep the tokens)
                yield TokenDelta([], [], [], "abort")
                return
            if await self._alive(b):
                raise EngineError(f"{self.kind} backend {b.url} broke the stream after {len(st.ids)} tokens "
                                  f"({_describe_exc(exc)})", status=502, code="bad_backend_response") from exc
            b.set_state("down", f"went away mid-stream: {_describe_exc(exc)}")
            raise EngineError(f"{self.kind} backend {b.url} went away after {len(st.ids)} tokens "
                              f"({_describe_exc(exc)})", status=503, code="backend_unavailable") from exc

    def _version_of(self, b: Backend, label: str | None, start_version: int) -> int:
        if label is None or not b.labels:
            return self._version
        v = b.labels.get(label)
        if v is None or v < start_version:
            what = "weights rlgate did not load" if v is None else f"stale weights (version {v})"
            b.dirty = True
            b.set_state("stale", f"serves {what}, labelled {label!r}")
            raise EngineError(
                f"{self.kind} backend {b.url} serves {what} (label {label!r}); the gateway is at version "
                f"{self._version}. The backend is out of rotation until it is resynced", status=503,
                code="backend_stale")
        return v

    def _http_error(self, b: Backend, resp: httpx.Response) -> EngineError:
        code, text = resp.status_code, _error_text(resp)
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

    async def _alive(self, b: Backend) -> bool:
        """Does the backend still answer? (Tells a dead server from a bad answer.)

        A fresh connection is used: a pooled keep-alive one to a dead server fails in other ways.
        """
        try:
            async with httpx.AsyncClient(base_url=b.url, headers=self._headers, transport=self._transport,
                                         timeout=httpx.Timeout(2.0)) as probe:
                await probe.get(self.health_path)
            return True
        except httpx.ReadTimeout:
            return True  # it accepted the connection and is working on the answer
        except httpx.HTTPError:
            return False

    # ------------------------------------------------------------------ health

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            try:
                await self.check_backends()
            except Exception:  # noqa: BLE001 - the loop must never die
                log.exception("%s health check failed", self.kind)

    async def check_backends(self) -> None:
        """One round of health checks (the health loop calls this; tests may too)."""
        await asyncio.gather(*(self._check(b) for b in self.backends))

    async def _health(self, b: Backend) -> str | None:
        """None if healthy, else why not."""
        try:
            r = await self._call(b, "GET", self.health_path, timeout=self.health_timeout)
        except httpx.HTTPError as exc:
            return f"health check: {_describe_exc(exc)}"
        if r.status_code != 200:
            return f"health check: HTTP {r.status_code}"
        return None

    async def _check(self, b: Backend) -> None:
        why = await self._health(b)
        if why is not None:
            if b.state != "down":
                b.set_state("down", why)
            return
        if self._eligible(b):
            return
        lock = self._update_lock
        if lock is None or lock.locked():
            return  # an update is running; it decides about this backend
        async with lock:
            await self._rejoin(b)

    async def _rejoin(self, b: Backend) -> None:
        """Bring a reachable backend back once its weights are the current version."""
        try:
            await self._probe(b)
            b.probed = True
            if b.dirty:
                in_sync = False
            elif b.label is not None and b.label in b.labels:
                in_sync = b.labels[b.label] == self._version
            else:  # no label (vLLM): it may have restarted with its launch weights
                in_sync = self._version == 0
            if not in_sync:
                path = self._path or b.model_path
                if path is None:
                    b.dirty = True
                    b.set_state("stale", "its weights are not the current version and no checkpoint is known")
                    return
                label = self._label_for(self._version)
                log.info("backend %s: loading %s (version %d) before it rejoins", b.url, path, self._version)
                await self._load(b, path, label)
                if self.reports_labels:
                    b.labels[label] = self._version
                    b.label = label
            b.version = self._version
            b.dirty = False
            b.set_state("healthy")
            log.info("backend %s rejoined at weight version %d", b.url, self._version)
        except (httpx.HTTPError, MalformedResponse, BackendRejected, WeightUpdateError) as exc:
            b.set_state("stale" if b.dirty else "down", f"rejoin failed: {_describe_exc(exc)}")

    # ------------------------------------------------------------------ weights

    def _label_for(self, version: int) -> str:
        return str(version)

    async def update_weights_from_path(self, path: str) -> int:
        """Load ``path`` on every eligible backend; bump the version only if all succeeded."""
        await self._ensure_ready()
        assert self._update_lock is not None
        async with self._update_lock:
            return await self._update(str(path))

    async def _update(self, path: str) -> int:
        targets = [b for b in self.backends if self._eligible(b)]
        if not targets:
            raise WeightUpdateError(f"no {self.kind} backend is available to load {path}; the weights are "
                                    f"unchanged (version {self._version})", status=503)
        old_version, new_version = self._version, self._version + 1
        new_label = self._label_for(new_version)
        t0 = time.perf_counter()
        paused: list[Backend] = []
        try:
            results = await asyncio.gather(*(self._pause_safely(b) for b in targets))
            paused = [b for b, ok in zip(targets, results, strict=True) if ok]
            errors = await asyncio.gather(*(self._load_safely(b, path, new_label) for b in targets))
            failed = [(b, e) for b, e in zip(targets, errors, strict=True) if e is not None]
            if not failed:
                for b in targets:
                    if self.reports_labels:
                        b.labels[new_label] = new_version
                        b.label = new_label
                    b.version = new_version
                self._version, self._path = new_version, path
                for b in self.backends:
                    if b not in targets:
                        b.dirty = True
                        log.warning("backend %s was not updated (%s); it is resynced before it rejoins", b.url,
                                    b.state)
                log.info("%s: loaded %s on %d backend(s) in %.1f s; weight version %d", self.kind, path,
                         len(targets), time.perf_counter() - t0, new_version)
                return new_version
            raise await self._roll_back(targets, failed, path, old_version)
        finally:
            await asyncio.gather(*(self._resume_safely(b) for b in paused))

    async def _roll_back(self, targets: list[Backend], failed: list[tuple[Backend, BaseException]], path: str,
                         old_version: int) -> WeightUpdateError:
        """Put every backend that may have changed back on the previous weights; quarantine the rest."""
        refused = {b for b, e in failed if isinstance(e, LoadRefused)}
        notes = [f"{b.url}: {_describe_exc(e)}" for b, e in failed]
        restored, quarantined = [], []
        for b in targets:
            if b in refused:
                continue  # it refused the checkpoint and kept its weights
            back = self._path or b.model_path
            label = next((lab for lab, v in b.labels.items() if v == old_version), self._label_for(old_version))
            err: BaseException | None = WeightUpdateError("the previous checkpoint is unknown")
            if back is not None:
                err = await self._load_safely(b, back, label)
            if err is None:
                if self.reports_labels:
                    b.label = label
                restored.append(b.url)
            else:
                b.dirty = True
                b.set_state("stale", f"weights unknown after a failed update to {path}; rollback failed: "
                                     f"{_describe_exc(err)}")
                quarantined.append(b.url)
        msg = (f"weight update to {path} failed on {len(failed)} of {len(targets)} {self.kind} backend(s): "
               f"{'; '.join(notes)}. The gateway keeps weight version {old_version}")
        if restored:
            msg += f"; rolled back to the previous weights: {', '.join(restored)}"
        if quarantined:
            msg += (f"; out of rotation until resynced (their weights are not version {old_version}): "
                    f"{', '.join(quarantined)}")
        log.error(msg)
        return WeightUpdateError(msg, status=502)

    async def _pause_safely(self, b: Backend) -> bool:
        try:
            return await self._pause(b)
        except (httpx.HTTPError, BackendRejected, MalformedResponse) as exc:
            log.warning("backend %s: could not pause generation (%s); updating without a pause", b.url,
                        _describe_exc(exc))
            return False

    async def _resume_safely(self, b: Backend) -> None:
        try:
            await self._resume(b)
        except (httpx.HTTPError, BackendRejected, MalformedResponse) as exc:
            log.error("backend %s: could not resume generation after the update: %s", b.url, _describe_exc(exc))
            b.set_state("stale", f"generation could not be resumed: {_describe_exc(exc)}")

    async def _load_safely(self, b: Backend, path: str, label: str) -> BaseException | None:
        try:
            await self._load(b, path, label)
            return None
        except (WeightUpdateError, httpx.HTTPError, BackendRejected, MalformedResponse) as exc:
            return exc


# ---------------------------------------------------------------------- helpers


async def _sse_data(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event (multi-line data joined with newlines).

    Parsed from raw bytes: cheaper than ``aiter_lines`` for streams of many small events.
    """
    buf = b""
    async for piece in resp.aiter_bytes():
        buf += piece
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
            if b"\r" in buf[:-1]:
                buf = buf[:-1].replace(b"\r", b"\n") + buf[-1:]
        while (end := buf.find(b"\n\n")) >= 0:
            event, buf = buf[:end], buf[end + 2:]
            data = _event_data(event)
            if data is not None:
                yield data
    if buf.strip():
        data = _event_data(buf.strip(b"\r\n"))
        if data is not None:
            yield data


def _event_data(event: bytes) -> bytes | None:
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if not sep or name not in (b"data", b"event", b"id", b"retry"):
            raise MalformedResponse(f"not a server-sent event stream: {line[:200]!r}")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


async def _drain(events: AsyncIterator[bytes], timeout: float = 1.0) -> None:
    """Read what follows the last event (usage, ``[DONE]``) for at most ``timeout`` seconds."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            async for _ in events:
                pass


def _check_tokens(chunk: Chunk) -> None:
    if len(chunk.token_ids) != len(chunk.logprobs):
        raise MalformedResponse(f"{len(chunk.token_ids)} token ids but {len(chunk.logprobs)} logprobs")
    for t in chunk.token_ids:
        if type(t) is not int or t < 0:
            raise MalformedResponse(f"token id {t!r} is not a non-negative integer")
    for lp in chunk.logprobs:
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp) or lp > 1e-3:
            raise MalformedResponse(f"logprob {lp!r} is not a finite number <= 0")


def as_int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        raise MalformedResponse(f"{what} is not a list of integers: {str(value)[:200]}")
    return value


def as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedResponse(f"{what} is not a number: {value!r}")
    return float(value)


def _error_text(resp: httpx.Response) -> str:
    """The message of an error body, in any of the shapes SGLang / vLLM / FastAPI use."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:_MAX_ERROR_BODY] or resp.reason_phrase
    return error_message(body) or json.dumps(body)[:_MAX_ERROR_BODY]


def error_message(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])[:_MAX_ERROR_BODY]
    if isinstance(err, str):
        return err[:_MAX_ERROR_BODY]
    for key in ("message", "detail"):
        if body.get(key):
            return str(body[key])[:_MAX_ERROR_BODY]
    return None


def _describe_exc(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.HTTPError) and type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    return text[:_MAX_ERROR_BODY]


__all__ = ["Backend", "BackendRejected", "Chunk", "LoadRefused", "MalformedResponse", "RemoteEngine"]
