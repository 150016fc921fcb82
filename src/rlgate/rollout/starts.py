"""Session starts batched: the episodes that start in the same turn of the event loop share one
``POST /rl/start_sessions`` call.

A rollout step admits all its episodes at once (the trainer grants a step's worth), and each
starts its session; 64 simultaneous ``start_session`` calls were the most expensive control calls
of an episode on the toy model (issue 28's profile: HTTP connection-pool work in the client grows
with the requests queued together). :class:`BatchedStarts` collects the starts asked for before
the loop's next turn and sends them as one call; each caller gets its own session, or the error
the single call would have raised for it (e.g. 429 ``no_capacity``, which the runner retries).

A caller cancelled while its batch is on the wire does not leave its session behind: the session
is finished (ended and exported, nothing recorded) as soon as the answer arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from rlgate.client.gateway import GatewayClient, GatewayClientError, SessionHandle

log = logging.getLogger("rlgate.rollout")

MAX_BATCH = 1024  # the route's limit (api/control/protocol.py: StartSessionsRequest)


class BatchedStarts:
    def __init__(self, client: GatewayClient) -> None:
        self.client = client
        self._queue: list[tuple[str, asyncio.Future[SessionHandle]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.calls = 0  # /rl/start_sessions calls sent (for tests and profiles)

    async def start(self, task_id: str) -> SessionHandle:
        """A session for ``task_id``; raises :class:`GatewayClientError` as ``start_session`` would."""
        fut: asyncio.Future[SessionHandle] = asyncio.get_running_loop().create_future()
        self._queue.append((task_id, fut))
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._send())
        return await fut

    async def _send(self) -> None:
        try:
            await asyncio.sleep(0)  # one turn of the loop: every episode starting now joins this batch
        except asyncio.CancelledError:
            for _, fut in self._take():
                fut.cancel()
            raise
        batch = self._take()
        for i in range(0, len(batch), MAX_BATCH):
            await self._send_one(batch[i:i + MAX_BATCH])

    def _take(self) -> list[tuple[str, asyncio.Future[SessionHandle]]]:
        """The starts queued so far; later ones make the next batch."""
        batch, self._queue, self._sender = self._queue, [], None
        return batch

    async def _send_one(self, batch: list[tuple[str, asyncio.Future[SessionHandle]]]) -> None:
        self.calls += 1
        try:
            results = await self.client.start_sessions([task_id for task_id, _ in batch])
        except Exception as exc:  # noqa: BLE001 - the call failed as a whole: each caller sees why
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        for (_, fut), result in zip(batch, results, strict=True):
            if fut.done():  # its episode was cancelled meanwhile: nobody will finish this session
                if isinstance(result, SessionHandle):
                    with contextlib.suppress(Exception):
                        await result.finish()
                continue
            if isinstance(result, GatewayClientError):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    async def aclose(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
