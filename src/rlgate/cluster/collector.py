"""Finished trajectories from every replica, without polling sessions one by one.

One puller per replica long-polls the replica's ``POST /rl/collect`` (exports of sessions that
ended, oldest first) and puts what it gets on one **bounded** queue. When the trainer falls
behind, the queue fills, the pullers stop asking, and finished sessions simply stay in the
replicas' durable stores: backpressure costs no memory in the trainer and loses nothing.
With the trainer granting session capacity one step at a time (``capacity_mode: granted``),
the queue bound is also the staleness limit: at most ``maxsize`` finished episodes wait for
the trainer, and no agent starts an episode the trainer has not allowed.

A replica that is down is skipped until it is back; the sessions it had finished are in its
store and are collected after the restart (an export is dropped on the replica only after
its response was sent: at-least-once).

Consumers either iterate (``async for export in collector``) or wait for one session
(``collector.expect(session_id)`` before ending it: what the rollout runner does for its own
episodes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Self

import httpx

from rlgate.cluster.directory import ReplicaTable
from rlgate.trajectory.export import DEFAULT_EXPORT_STYLE, NO_DISCOUNT

__all__ = ["Collector"]

log = logging.getLogger("rlgate.cluster.collector")


class Collector:
    def __init__(self, table: ReplicaTable, admin_key: str, *, maxsize: int = 256, batch: int = 32,
                 poll_wait: float = 2.0, style: str = DEFAULT_EXPORT_STYLE, discount: float = NO_DISCOUNT) -> None:
        self.table = table
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)
        self.batch = batch
        self.poll_wait = poll_wait
        self.body = {"style": style, "discount": discount}
        self._http = httpx.AsyncClient(timeout=poll_wait + 30, headers={"Authorization": f"Bearer {admin_key}"})
        self._tasks: list[asyncio.Task[None]] = []
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.collected = 0

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._pull(r.index)) for r in self.table.replicas]

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _pull(self, index: int) -> None:
        delay = 0.05
        while True:
            r = self.table.replicas[index]
            room = self.queue.maxsize - self.queue.qsize() if self.queue.maxsize else self.batch
            if r.state == "down" or not r.url or room <= 0 and not self._waiters:
                await asyncio.sleep(delay if r.state == "down" else 0.01)
                continue
            try:
                resp = await self._http.post(r.url + "/rl/collect", json={
                    **self.body, "max_sessions": max(1, min(self.batch, room)), "wait_timeout": self.poll_wait})
                resp.raise_for_status()
                exports = resp.json()["sessions"]
                delay = 0.05
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.debug("collect from replica %d failed: %s", index, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            for export in exports:
                self.collected += 1
                waiter = self._waiters.pop(export["session_id"], None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(export)
                else:
                    await self.queue.put(export)  # blocks when the trainer is behind: backpressure

    def expect(self, session_id: str) -> asyncio.Future[dict[str, Any]]:
        """A future for the export of ``session_id``; call it *before* ending the session, so the
        export cannot reach the queue first. Cancel the future to stop waiting."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: self._waiters.pop(session_id, None) if self._waiters.get(session_id) is f
                              else None)
        self._waiters[session_id] = fut
        return fut

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            yield await self.queue.get()
