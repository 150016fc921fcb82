"""The router: one ASGI app in front of N gateway replicas, speaking exactly their HTTP API.

Stateless: which replica serves a request is read from the request itself (see
``cluster/keys.py``), so any number of routers can run side by side:

==============================  =========================================================
request                         goes to
==============================  =========================================================
session key (generation,        the replica the key names (HMAC-checked here: a forged or
``end_session``, ``set_reward``) malformed ``rk1.`` key is a 401 without touching a replica);
                                a key the client chose: rendezvous hash of the key
``POST /rl/start_session``      the less loaded of two random healthy replicas (power of
                                two choices); a client-chosen ``api_key``: its hashed replica
admin + ``session_id`` in body  the replica named by the id (``r<k>.`` prefix):
(``/export_trajectories``,      ``/export_trajectories``, ``/rl/set_reward``,
``/rl/set_reward``,             ``/rl/finish_session``
``/rl/finish_session``)
``POST /grant_capacity``        split across the healthy replicas
``POST /rl/update_weights``     the weight-update controller (a barrier across replicas)
``GET /rl/metrics``             every replica, summed (+ per replica)
``GET /health``                 answered here: the replicas (node, pid, state, load)
anything else                   any healthy replica
==============================  =========================================================

Bodies are forwarded as bytes and responses streamed back as they arrive (SSE included,
unparsed). If the replica cannot be reached the client gets a **503** in its API's error
shape with code ``replica_unavailable``; if the replica dies in the middle of a stream, an
error event in the stream's format ends it.

Data plane: plain HTTP/1.1 from the router to each replica's own port, over a pool of
keep-alive connections (``cluster/upstream.py``: one write per request, responses parsed
by ``httptools`` in C); a response up to ``WHOLE_RESPONSE_BYTES`` goes back to the client in
one piece with its ``Content-Length``, a larger one or a stream chunk by chunk as it
arrives. Ray only places and restarts the replicas and carries control calls (info, weight
updates); see docs/architecture.md for why and for the measurements.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from rlgate.api.auth import ADMIN_ONLY_PATHS
from rlgate.cluster import router_metrics
from rlgate.cluster.directory import ReplicaInfo, ReplicaTable
from rlgate.cluster.keys import is_minted, session_id_replica
from rlgate.cluster.router_edge import RouterKeys, bearer_token, edge_app, missing_key
from rlgate.cluster.router_viewer import RouterViewer
from rlgate.cluster.upstream import Upstream, UpstreamUnavailable
from rlgate.config import GatewayConfig
from rlgate.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unavailable,
    error_body,
)
from rlgate.surfaces import RESPONSES, ResponsesStream, error_shape, find_last_seq, surface_for

log = logging.getLogger("rlgate.cluster.router")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
WeightUpdater = Callable[[str], Awaitable[int]]

_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
               b"proxy-authorization", b"proxy-connection", b"content-length", b"host"}
WHOLE_RESPONSE_BYTES = 1024 * 1024  # responses up to this size go back in one piece; larger ones stream
_ADMIN_SESSION_ROUTES = {"/export_trajectories", "/rl/set_reward", "/rl/finish_session"}


class Router:
    def __init__(
        self,
        table: ReplicaTable,
        *,
        admin_key: str,
        routing_secret: bytes | None = None,
        update_weights: WeightUpdater | None = None,
        config: GatewayConfig | None = None,
        upstream: Upstream | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``config``: the replicas' gateway settings; the router applies the same body limits and
        timeouts (``max_body_bytes``, ``body_timeout``, ``max_buffered_body_bytes``) and serves the
        viewer when ``config.ui``."""
        self.table = table
        self.config = config or GatewayConfig(admin_key=admin_key)
        self.keys = RouterKeys(admin_key, routing_secret, lambda: len(self.table.replicas), self._confirm_key)
        self._update_weights = update_weights
        self.max_body_bytes = self.config.max_body_bytes
        self.upstream = upstream or Upstream()
        self._rng = rng or random.Random()
        self.forwarded = 0
        self.viewer = RouterViewer(self.upstream, self.table, self.config, admin_key, self.is_admin, self._forward) \
            if self.config.ui else None
        self.edge = edge_app(self._http, self.keys, self.config)  # keys before bodies, body limits

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        await self.edge(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        try:
            await self._dispatch(scope, receive, send, path)
        except GatewayError as exc:
            await _send_raw(send, exc.status, [(b"content-type", b"application/json"),
                                               *((k.encode(), v.encode()) for k, v in exc.headers.items())],
                            json.dumps(error_body(exc, error_shape(path))).encode())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.upstream.start()
                    await self.table.start()
                except Exception as exc:  # noqa: BLE001 - reported to the server, which exits
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.table.stop()
                await self.upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def is_admin(self, token: str | None) -> bool:
        return self.keys.is_admin(token)

    async def _confirm_key(self, index: int, token: str) -> int | None:
        """The status replica ``index`` answers ``GET /v1/models`` with ``token`` (None: unreachable):
        how the edge confirms a client-chosen key before a body is read (cluster/router_edge.py)."""
        r = self.table.replicas[index]
        if r.state == "down" or not r.url:
            return None
        try:
            status, _, _ = await self.upstream.call(r.url, "GET", "/v1/models",
                                                    [(b"authorization", b"Bearer " + token.encode())], b"")
        except UpstreamUnavailable as exc:
            self.table.mark_down(r, str(exc))
            return None
        return status

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        method: str = scope["method"]
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        token = bearer_token(headers)
        admin = self.is_admin(token)
        if path == "/health" and method == "GET":
            await _send_json(send, 200, self.health(full=admin))
            return
        if self.viewer is not None and (path == "/ui" or path.startswith("/ui/")):
            await self.viewer.handle(scope, receive, send, admin)
            return
        if path in ADMIN_ONLY_PATHS:  # as a gateway answers: 401 without a key, 403 with another one
            self._require_admin(admin, token)
        if path.startswith("/rl/policies"):  # per gateway (core/policies.py): one replica's load would differ
            raise InvalidRequest("policies (LoRA adapters) are not served behind the cluster router yet: load them "
                                 "on a single gateway (docs/policies.md)", code="not_supported")
        if path == "/metrics" and method == "GET":
            text = await router_metrics.cluster_exposition(self.upstream, self.table, self.forwarded, headers)
            await _send_raw(send, 200, [(b"content-type", router_metrics.CONTENT_TYPE.encode())], text)
            return
        if path == "/rl/collect" and method == "POST":
            await _send_json(send, 200, await self._collect(headers, await self._body(receive, path)))
            return
        if path == "/rl/update_weights" and method == "POST" and self._update_weights is not None:
            await self._update(admin, token, await self._body(receive, path), send)
            return
        if path == "/rl/metrics" and method == "GET":
            self._require_admin(admin, token)
            await _send_json(send, 200, await self._metrics(headers))
            return
        if path == "/grant_capacity" and method == "POST":
            self._require_admin(admin, token)
            await self._grant(headers, await self._body(receive, path), send)
            return
        body = await self._body(receive, path)
        if path == "/rl/start_session" and method == "POST" and admin:
            await self._start_session(scope, headers, body, send)
            return
        if admin and path in _ADMIN_SESSION_ROUTES and method == "POST":
            replica = self._replica_of_session(_json_field(body, "session_id"), path)
        elif token is not None and not admin:
            replica = self._replica_of_key(token)
        else:  # admin routes that name no session, unauthenticated requests (the replica answers 401)
            replica = self._any_healthy()
        await self._forward(replica, scope, headers, body, send)

    # ------------------------------------------------------------------ choosing a replica

    def _replica_of_key(self, token: str) -> ReplicaInfo:
        return self.table.replicas[self.keys.replica_of(token)]

    def _replica_of_session(self, session_id: Any, path: str) -> ReplicaInfo:
        if session_id is None:  # the replica explains what is missing
            return self._any_healthy()
        index = session_id_replica(session_id) if isinstance(session_id, str) else None
        if index is None or index >= len(self.table.replicas):
            raise NotFound(f"session {session_id!r} not found (not a session id of this cluster)")
        return self.table.replicas[index]

    def healthy(self) -> list[ReplicaInfo]:
        return [r for r in self.table.replicas if r.state == "healthy" and r.url]

    def _any_healthy(self) -> ReplicaInfo:
        ok = self.healthy() or [r for r in self.table.replicas if r.state == "paused" and r.url]
        if not ok:
            raise Unavailable("no gateway replica is available right now", code="no_replica")
        return self._rng.choice(ok)

    def _two_choices(self) -> list[ReplicaInfo]:
        """Healthy replicas, the better of two random ones first, then the rest by load."""
        ok = self.healthy()
        if not ok:
            paused = [r for r in self.table.replicas if r.state == "paused" and r.url]
            if not paused:
                raise Unavailable("no gateway replica is available for a new session", code="no_replica")
            ok = paused

        def load(r: ReplicaInfo) -> int:
            return r.load + r.started_since_refresh

        pair = self._rng.sample(ok, min(2, len(ok)))
        first = min(pair, key=load)
        return [first] + sorted((r for r in ok if r is not first), key=load)

    # ------------------------------------------------------------------ special routes

    def _require_admin(self, admin: bool, token: str | None) -> None:
        if token is None:
            raise missing_key()
        if not admin:
            raise PermissionDenied("this route needs the admin key")

    async def _start_session(self, scope: Scope, headers: list[tuple[bytes, bytes]], body: bytes,
                             send: Send) -> None:
        chosen_key = _json_field(body, "api_key")
        if isinstance(chosen_key, str) and chosen_key:
            if is_minted(chosen_key):
                raise InvalidRequest("api_key must not start with 'rk1.' (reserved for keys the gateway makes)",
                                     param="api_key")
            await self._forward(self._replica_of_key(chosen_key), scope, headers, body, send)
            return
        candidates = self._two_choices()
        for i, r in enumerate(candidates):
            last = i == len(candidates) - 1
            try:
                status, resp_headers, data = await self.upstream.call(r.url or "", "POST", "/rl/start_session",
                                                                      headers, body)
            except UpstreamUnavailable as exc:
                self.table.mark_down(r, str(exc))
                if last:
                    raise Unavailable("no gateway replica could start the session", code="no_replica") from exc
                continue
            # no capacity / shutting down there: another replica may have some
            if status in (429, 503) and not last and _error_code(data) in ("no_capacity", "shutting_down",
                                                                             "too_many_sessions"):
                continue
            if status == 200:
                r.started_since_refresh += 1
            await _send_raw(send, status, resp_headers, data)
            return

    async def _grant(self, headers: list[tuple[bytes, bytes]], body: bytes, send: Send) -> None:
        count = 1
        if body.strip():
            raw = _json_field(body, "count")
            if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= 1_000_000:
                raise InvalidRequest("count: must be an integer in [1, 1000000]", param="count", status=422)
            count = raw
        targets = self.healthy() or self.table.replicas
        share, extra = divmod(count, len(targets))
        # the least loaded replicas get the remainder
        order = sorted(targets, key=lambda r: r.load + r.started_since_refresh)
        total = 0
        for i, r in enumerate(order):
            n = share + (1 if i < extra else 0)
            if n == 0:
                continue
            try:
                status, _, data = await self.upstream.call(r.url or "", "POST", "/grant_capacity", headers,
                                                           json.dumps({"count": n}).encode())
            except UpstreamUnavailable as exc:
                raise Unavailable(f"replica {r.index} is unavailable: capacity not granted", code="replica_unavailable"
                                  ) from exc
            if status != 200:
                raise GatewayError(f"replica {r.index} refused the capacity grant: {data[:200]!r}", status=status)
            total += int(json.loads(data)["capacity"])
        await _send_json(send, 200, {"capacity": total})

    async def _metrics(self, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        per: list[dict[str, Any]] = []
        summed: dict[str, int] = {}
        for r in self.table.replicas:
            entry = {**r.describe(), "url": r.url}  # admin only: where the replica listens
            if r.url and r.state != "down":
                try:
                    status, _, data = await self.upstream.call(r.url, "GET", "/rl/metrics", headers, b"")
                    if status == 200:
                        m = json.loads(data)
                        entry["metrics"] = m
                        for k, v in m.items():
                            if isinstance(v, int) and not isinstance(v, bool) and k != "engine_version":
                                summed[k] = summed.get(k, 0) + v
                except UpstreamUnavailable as exc:
                    entry["error"] = str(exc)
            per.append(entry)
        versions = {r.version for r in self.table.replicas if r.state != "down"}
        return {**summed, "engine_version": max(versions) if versions else 0, "replicas": per,
                "router": {"forwarded": self.forwarded}}

    async def _update(self, admin: bool, token: str | None, body: bytes, send: Send) -> None:
        self._require_admin(admin, token)
        assert self._update_weights is not None
        path = _json_field(body, "path")
        if not isinstance(path, str) or not path:
            raise InvalidRequest("path: a checkpoint directory is required", param="path", status=422)
        version = await self._update_weights(path)
        await _send_json(send, 200, {"message": "success", "version": version})

    def health(self, *, full: bool = True) -> dict[str, Any]:
        """``status`` (ok / degraded / down) for anyone; with ``full`` (the admin key) also each
        replica's state, load, node and pid, which an anonymous caller must not learn (issue 23)."""
        replicas = [r.describe() for r in self.table.replicas]
        healthy = sum(1 for r in self.table.replicas if r.state in ("healthy", "paused"))
        status = "ok" if healthy == len(replicas) else ("degraded" if healthy else "down")
        if not full:
            return {"status": status}
        versions = [r.version for r in self.table.replicas if r.state != "down"]
        return {"status": status, "version": max(versions) if versions else 0,
                "replicas": replicas, "healthy": healthy, "total": len(replicas)}

    async def _collect(self, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
        """``POST /rl/collect`` across the cluster: finished sessions from every replica, at most
        ``max_sessions`` in all (each replica is asked for its share, so none is exported and then
        dropped here); a long poll (``wait_timeout``) waits on every replica at once."""
        try:
            req = json.loads(body) if body.strip() else {}
        except ValueError:
            req = None
        if not isinstance(req, dict):
            raise InvalidRequest("the request body is not a JSON object", code="invalid_json", status=422)
        want = req.get("max_sessions", 16)
        if not isinstance(want, int) or isinstance(want, bool) or not 1 <= want <= 1000:
            raise InvalidRequest("max_sessions: must be an integer in [1, 1000]", param="max_sessions", status=422)
        live = [r for r in self.table.replicas if r.url and r.state != "down"]
        if not live:
            raise Unavailable("no gateway replica is available right now", code="no_replica")
        start = self._rng.randrange(len(live))
        live = live[start:] + live[:start]  # no replica always first
        out: list[Any] = []
        for r in live:  # first without waiting: whatever is finished anywhere
            if len(out) >= want:
                break
            out += await self._collect_from(r, headers, {**req, "max_sessions": want - len(out), "wait_timeout": 0})
        if not out and float(req.get("wait_timeout") or 0) > 0:
            share, extra = divmod(want, len(live))
            asks = [(r, share + (1 if i < extra else 0)) for i, r in enumerate(live)]
            parts = await asyncio.gather(*(self._collect_from(r, headers, {**req, "max_sessions": n})
                                           for r, n in asks if n > 0))
            out = [s for part in parts for s in part]
        return {"sessions": out}

    async def _collect_from(self, r: ReplicaInfo, headers: list[tuple[bytes, bytes]], req: dict[str, Any]
                            ) -> list[Any]:
        try:
            status, _, data = await self.upstream.call(r.url or "", "POST", "/rl/collect", headers,
                                                       json.dumps(req).encode())
        except UpstreamUnavailable as exc:
            self.table.mark_down(r, str(exc))
            return []
        if status != 200:
            raise GatewayError(f"replica {r.index} refused /rl/collect: {data[:300]!r}", status=status)
        return list(json.loads(data)["sessions"])

    # ------------------------------------------------------------------ forwarding

    async def _body(self, receive: Receive, path: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return b""
            part = msg.get("body", b"")
            size += len(part)
            if size > self.max_body_bytes:
                raise PayloadTooLarge(f"request body is larger than {self.max_body_bytes} bytes")
            chunks.append(part)
            if not msg.get("more_body"):
                return b"".join(chunks)

    async def _forward(self, r: ReplicaInfo, scope: Scope, headers: list[tuple[bytes, bytes]], body: bytes,
                       send: Send) -> None:
        path = scope["path"]
        if r.state == "down" or not r.url:
            raise Unavailable(
                f"gateway replica {r.index}, which holds this session, is unavailable ({r.reason or 'down'}); "
                "sessions that were live on it are lost, new sessions go to the other replicas",
                code="replica_unavailable")
        target = scope.get("raw_path") or path.encode()
        if scope.get("query_string"):
            target = target + b"?" + scope["query_string"]
        self.forwarded += 1
        try:
            resp = await self.upstream.open(r.url, scope["method"], target.decode("latin-1"), headers, body)
        except UpstreamUnavailable as exc:
            self.table.mark_down(r, str(exc))
            raise Unavailable(
                f"gateway replica {r.index}, which holds this session, is unavailable ({exc}); sessions that were "
                "live on it are lost, new sessions go to the other replicas", code="replica_unavailable") from exc
        length = next((v for k, v in resp.headers if k == b"content-length"), None)
        if (not resp.is_sse and scope["method"] != "HEAD" and length is not None and length.isdigit()
                and int(length) <= WHOLE_RESPONSE_BYTES):
            # a small whole response (every non-streamed reply): read it, send it in one piece;
            # a large one (an export) streams through, so the router never holds it
            try:
                data = await resp.read()
            except UpstreamUnavailable as exc:
                self.table.mark_down(r, str(exc))
                raise _went_away(r, exc) from exc
            finally:
                resp.release()
            await _send_raw(send, resp.status, resp.headers, data)
            return
        started = False
        # a Responses stream's error frames carry on its sequence numbers and response object
        tracked = ResponsesStream() if resp.is_sse and surface_for(path) is RESPONSES else None
        try:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(k, v) for k, v in resp.headers if k not in _HOP_BY_HOP]})
            started = True
            async for chunk in resp.chunks():
                if tracked is not None:
                    _track(tracked, chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamUnavailable as exc:
            # the replica went away mid-response: end the stream with an error in its format
            self.table.mark_down(r, str(exc))
            if started and resp.is_sse:
                surface = surface_for(path)
                err = _went_away(r, exc)
                frames = surface.stream_error_frames(err, tracked) if surface is not None else \
                    [b"data: " + json.dumps(error_body(err, error_shape(path))).encode() + b"\n\n"]
                await send({"type": "http.response.body", "body": b"".join(frames), "more_body": True})
        finally:
            resp.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _went_away(r: ReplicaInfo, exc: Exception) -> Unavailable:
    return Unavailable(f"gateway replica {r.index} went away during the response ({exc})", code="replica_unavailable")


def _track(st: ResponsesStream, chunk: bytes) -> None:
    """Follow a Responses stream passing through: the response object its first event announced,
    and the next sequence number (so an error frame continues the stream as the replica would)."""
    if st.response is None and b'"response.created"' in chunk:
        for frame in chunk.split(b"\n\n"):
            for line in frame.split(b"\n"):
                if line.startswith(b"data: "):
                    try:
                        ev = json.loads(line[6:])
                    except ValueError:
                        continue
                    if isinstance(ev, dict) and ev.get("type") == "response.created" and \
                            isinstance(ev.get("response"), dict):
                        st.response = ev["response"]
                        break
            if st.response is not None:
                break
    last = find_last_seq(chunk)
    if last is not None:
        st.next_seq = last + 1


def _json_field(body: bytes, name: str) -> Any:
    try:
        obj = json.loads(body) if body.strip() else None
    except ValueError:
        return None  # the replica answers the malformed body in its own words
    return obj.get(name) if isinstance(obj, dict) else None


def _error_code(data: bytes) -> str | None:
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    return err.get("code") if isinstance(err, dict) else None


async def _send_json(send: Send, status: int, obj: Any) -> None:
    await _send_raw(send, status, [(b"content-type", b"application/json")], json.dumps(obj).encode())


async def _send_raw(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [(k, v) for k, v in headers if k not in _HOP_BY_HOP]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
