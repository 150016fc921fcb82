"""What a router knows about the replicas: where they listen, whether they serve, their load.

The router keeps no session state. Its only state is this table of replicas, refreshed every
``interval`` seconds from a :class:`Directory`: :class:`RayDirectory` asks each replica actor
(``GatewayReplica.info``) through Ray; :class:`StaticDirectory` polls fixed gateway URLs over
HTTP (tests, or replicas run outside Ray).

Replica states: ``healthy`` (takes new sessions), ``paused`` (a weight update is under way:
requests are forwarded and wait there), ``stale`` (its weights are not the cluster's version:
no new sessions), ``down`` (unreachable: its sessions answer 503 until Ray restarts it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlgate.supervised import forever

log = logging.getLogger("rlgate.cluster")

ReplicaStateName = str  # healthy | paused | stale | down | starting


@dataclass
class ReplicaInfo:
    index: int
    url: str | None = None  # http://host:port of the replica's gateway (None until known)
    state: ReplicaStateName = "starting"
    node: str = ""  # Ray node id (or host) it runs on
    node_ip: str = ""
    pid: int = 0
    load: int = 0  # open sessions + generations in flight, as last reported
    version: int = 0  # weight version
    restarts: int = 0  # times the router saw it come back with another pid
    reason: str = ""  # why it is not healthy
    seen_at: float = 0.0
    started_since_refresh: int = field(default=0, repr=False)  # sessions this router sent since

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "state": self.state, "node": self.node, "node_ip": self.node_ip,
                "pid": self.pid, "load": self.load + self.started_since_refresh, "version": self.version,
                "restarts": self.restarts, **({"reason": self.reason} if self.reason else {})}


class Directory(Protocol):
    @property
    def size(self) -> int:
        """Number of replicas (fixed for the lifetime of the cluster)."""
        ...

    async def fetch(self, index: int) -> dict[str, Any]:
        """The replica's own report (``GatewayReplica.info``); raises if it cannot be reached."""
        ...


class ReplicaTable:
    """The router's view of the replicas, refreshed in the background."""

    def __init__(self, directory: Directory, *, interval: float = 0.5, timeout: float = 5.0) -> None:
        self.directory = directory
        self.interval = interval
        self.timeout = timeout
        self.replicas = [ReplicaInfo(i) for i in range(directory.size)]
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        await forever(self.refresh, wait=self.interval, what="replica refresh", log=log)

    async def refresh(self) -> None:
        await asyncio.gather(*(self._refresh_one(r) for r in self.replicas))

    async def _refresh_one(self, r: ReplicaInfo) -> None:
        try:
            info = await asyncio.wait_for(self.directory.fetch(r.index), self.timeout)
        except Exception as exc:  # noqa: BLE001 - any failure to reach it: down
            self.mark_down(r, f"unreachable: {type(exc).__name__}: {exc}"[:300])
            return
        if r.pid and info.get("pid") and info["pid"] != r.pid:
            r.restarts += 1
            log.warning("replica %d came back as pid %s on %s", r.index, info["pid"], info.get("node_ip"))
        r.url = info.get("url") or r.url
        r.state = info.get("state", "healthy")
        r.reason = info.get("reason", "")
        r.node = info.get("node", "")
        r.node_ip = info.get("node_ip", "")
        r.pid = int(info.get("pid") or 0)
        r.load = int(info.get("load") or 0)
        r.version = int(info.get("version") or 0)
        r.seen_at = time.monotonic()
        r.started_since_refresh = 0

    def mark_down(self, r: ReplicaInfo, reason: str) -> None:
        if r.state != "down":
            log.warning("replica %d is down: %s", r.index, reason)
        r.state = "down"
        r.reason = reason



class StaticDirectory:
    """Gateways at fixed URLs, polled over HTTP (``GET /health`` and the admin metrics)."""

    def __init__(self, urls: list[str], admin_key: str) -> None:
        import httpx

        self.urls = [u.rstrip("/") for u in urls]
        self._http = httpx.AsyncClient(timeout=5.0, headers={"Authorization": f"Bearer {admin_key}"})

    @property
    def size(self) -> int:
        return len(self.urls)

    async def fetch(self, index: int) -> dict[str, Any]:
        url = self.urls[index]
        health = (await self._http.get(url + "/health")).json()
        m = (await self._http.get(url + "/rl/metrics")).json()
        return {"url": url, "state": "healthy" if health.get("status") == "ok" else "stale",
                "version": health.get("version", 0), "load": m.get("open_sessions", 0), "node": "static",
                "node_ip": url, "pid": 0}

    async def aclose(self) -> None:
        await self._http.aclose()
