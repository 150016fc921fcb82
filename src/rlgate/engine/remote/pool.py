"""The backends of a remote engine: connections, session affinity and which one serves.

* **Affinity.** The first request of a session goes to the least-loaded eligible backend
  (fewest requests in flight, then fewest pinned sessions); every later request of that
  session goes to the same backend, so its prefix cache is reused turn after turn. The
  pins of the least recently used sessions are forgotten beyond ``MAX_AFFINITY``.
* **Eligible** means healthy and holding the gateway's current weight version
  (:attr:`BackendPool.version`).
* **Moving a session is token-exact.** rlgate sends the whole prompt as token ids on
  every turn and keeps no state on the backend, so a turn served by another backend
  holding the same weight version continues the same token sequence; only the prefix
  cache is lost. ``failover="move"`` enables it; the default (``"fail"``) answers 503 so
  that an operator sees the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Literal

import httpx

from rlgate.engine.base import EngineError
from rlgate.engine.remote.backend import Backend
from rlgate.engine.remote.errors import BackendRejected, MalformedResponse, error_text

__all__ = ["MAX_AFFINITY", "POOL_SHARD", "BackendPool", "Failover"]

log = logging.getLogger("rlgate.engine.remote")

Failover = Literal["fail", "move"]

POOL_SHARD = 16  # connections per httpx pool (see BackendPool.client)
KEEPALIVE_S = 3.0  # idle connections kept this long (below the 5 s uvicorn default of SGLang and vLLM)
MAX_AFFINITY = 200_000  # pinned sessions remembered (least recently used are forgotten)


class BackendPool:
    """The backends, their HTTP clients, and the session -> backend pins."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        kind: str,
        failover: Failover,
        health_path: str,
        timeout: httpx.Timeout,
        max_connections: int,
        headers: dict[str, str],
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.backends = [Backend(u, i) for i, u in enumerate(urls)]
        self.kind = kind
        self.failover: Failover = failover
        self.health_path = health_path
        self.timeout = timeout
        self.max_connections = max_connections
        self.headers = headers
        self.transport = transport
        self.version = 0  # the gateway's weight version: only backends holding it serve
        self.path: str | None = None  # checkpoint of the current version (None: launch weights)
        self._affinity: OrderedDict[str, Backend] = OrderedDict()

    # ------------------------------------------------------------------ HTTP

    def client(self, b: Backend) -> httpx.AsyncClient:
        """A client for ``b``: one of several small connection pools, used in turn.

        httpcore's pool scans all of its connections (and polls every idle socket) whenever a
        request starts or ends, so one pool of hundreds of connections costs milliseconds per
        request under load; shards of ``POOL_SHARD`` connections keep that scan short.
        """
        loop = asyncio.get_running_loop()
        if not b.clients or b.loop is not loop:
            n = max(1, -(-self.max_connections // POOL_SHARD))
            per = max(1, -(-self.max_connections // n))
            # Idle connections are dropped before the backend's own keep-alive timeout (uvicorn's
            # default, used by SGLang and vLLM, is 5 s) so a request rarely lands on one it is closing.
            limits = httpx.Limits(max_connections=per, max_keepalive_connections=per, keepalive_expiry=KEEPALIVE_S)
            b.clients = [httpx.AsyncClient(base_url=b.url, timeout=self.timeout, limits=limits,
                                           headers=self.headers, transport=self.transport) for _ in range(n)]
            b.loop = loop
        b.turn += 1
        return b.clients[b.turn % len(b.clients)]

    async def call(self, b: Backend, method: str, path: str, *, json_body: Any = None,
                   params: dict[str, Any] | None = None, timeout: float | None = None) -> httpx.Response:
        kw: dict[str, Any] = {}
        if json_body is not None:
            kw["json"] = json_body
        if params:
            kw["params"] = params
        if timeout is not None:
            kw["timeout"] = httpx.Timeout(timeout, connect=self.timeout.connect)
        try:
            return await self.client(b).request(method, path, **kw)
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            # A keep-alive connection the server closed as we sent on it (vLLM closes it after a 500 from
            # a failed collective_rpc): sent once more on a fresh one. Every control call rlgate makes is
            # idempotent (info, pause, resume, reload from a path, cache reset, the probe).
            return await self.client(b).request(method, path, **kw)

    async def get_json(self, b: Backend, path: str, *, timeout: float | None = None) -> Any:
        r = await self.call(b, "GET", path, timeout=timeout)
        if r.status_code != 200:
            raise BackendRejected(f"GET {path} -> HTTP {r.status_code}: {error_text(r)}", r.status_code)
        try:
            return r.json()
        except ValueError as exc:
            raise MalformedResponse(f"GET {path} returned non-JSON: {r.text[:200]!r}") from exc

    async def alive(self, b: Backend) -> bool:
        """Does the backend still answer? (Tells a dead server from a bad answer.)

        A fresh connection is used: a pooled keep-alive one to a dead server fails in other ways.
        """
        try:
            async with httpx.AsyncClient(base_url=b.url, headers=self.headers, transport=self.transport,
                                         timeout=httpx.Timeout(2.0)) as probe:
                await probe.get(self.health_path)
            return True
        except httpx.ReadTimeout:
            return True  # it accepted the connection and is working on the answer
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        for b in self.backends:
            clients, b.clients = b.clients, []
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.aclose()

    # ------------------------------------------------------------------ routing

    def eligible(self, b: Backend) -> bool:
        return b.state == "healthy" and b.version == self.version

    def least_loaded(self) -> Backend:
        ok = [b for b in self.backends if self.eligible(b)]
        if not ok:
            states = "; ".join(f"{b.url}: {b.state}{' (' + b.reason + ')' if b.reason else ''}"
                               for b in self.backends)
            raise EngineError(f"no {self.kind} backend is available ({states})", status=503,
                              code="backend_unavailable")
        return min(ok, key=lambda b: (b.in_flight, b.sessions, b.served, b.index))

    def pin(self, session_id: str, b: Backend) -> None:
        old = self._affinity.pop(session_id, None)
        if old is not None:
            old.sessions -= 1
        self._affinity[session_id] = b
        b.sessions += 1
        while len(self._affinity) > MAX_AFFINITY:
            _, evicted = self._affinity.popitem(last=False)
            evicted.sessions -= 1

    def backend_for(self, session_id: str) -> Backend | None:
        """The backend a session is pinned to (None if it has not been served yet)."""
        return self._affinity.get(session_id)

    def route(self, session_id: str | None) -> Backend:
        """The backend that serves the next request of ``session_id`` (pinning it on first use)."""
        if session_id is None:
            return self.least_loaded()
        b = self._affinity.get(session_id)
        if b is None:
            b = self.least_loaded()
            self.pin(session_id, b)
            return b
        self._affinity.move_to_end(session_id)
        if self.eligible(b):
            return b
        why = b.reason or ("its weights are not the current version" if b.state == "healthy" else b.state)
        if self.failover == "fail":
            raise EngineError(
                f"session {session_id!r} is pinned to {self.kind} backend {b.url}, which is unavailable ({why}); "
                "its requests fail until the backend is healthy again (start the gateway with --failover move "
                "to move such sessions to another backend)",
                status=503, code="backend_unavailable",
            )
        nb = self.least_loaded()
        log.warning("session %s: moving from %s (%s) to %s", session_id, b.url, why, nb.url)
        self.pin(session_id, nb)
        return nb
