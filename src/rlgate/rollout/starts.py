"""Session starts batched: the episodes that start in the same turn of the event loop share one
``POST /rl/start_sessions`` call.

A rollout step admits all its episodes at once (the trainer grants a step's worth), and each
starts its session; 64 simultaneous ``start_session`` calls were the most expensive control calls
of an episode on the toy model (issue 28's profile: HTTP connection-pool work in the client grows
with the requests queued together). :class:`BatchedStarts` collects the starts asked for before
the loop's next turn and sends them as one call; each caller gets its own session, or the error
the single call would have raised for it (e.g. 429 ``no_capacity``, which the runner retries).

A start alone in its turn goes out as a plain ``start_session``, and so do all of them when the
gateway is a cluster router (which places each session on a replica itself; a batch would land on
one). A caller cancelled while its batch is on the wire does not leave its session behind: the
session is finished (ended and exported, nothing recorded) as soon as the answer arrives.
"""

from __future__ import annotations

import asyncio
import contextlib

from rlgate.client.gateway import GatewayClient, GatewayClientError, SessionHandle

MAX_BATCH = 1024  # the route's limit (api/control/protocol.py: StartSessionsRequest)


class BatchedStarts:
    def __init__(self, client: GatewayClient) -> None:
        self.client = client
        self._queue: list[tuple[str, asyncio.Future[SessionHandle]]] = []  # the batch being gathered
        self._tasks: set[asyncio.Task[None]] = set()  # batches gathering or on the wire
        self.calls = 0  # /rl/start_sessions calls sent (for tests and profiles)
        self.direct: bool | None = None  # the gateway is no cluster router (None: not asked yet)

    async def start(self, task_id: str) -> SessionHandle:
        """A session for ``task_id``; raises :class:`GatewayClientError` as ``start_session`` would."""
        fut: asyncio.Future[SessionHandle] = asyncio.get_running_loop().create_future()
        self._queue.append((task_id, fut))
        if len(self._queue) == 1:  # the first of a new batch sends it
            task = asyncio.ensure_future(self._send())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _send(self) -> None:
        batch: list[tuple[str, asyncio.Future[SessionHandle]]] = []
        try:
            await asyncio.sleep(0)  # one turn of the loop: every episode starting now joins this batch
            batch, self._queue = self._queue, []  # later starts make the next batch
            if len(batch) == 1 or not await self._direct():
                await asyncio.gather(*(self._send_one([item], single=True) for item in batch))
            else:
                for i in range(0, len(batch), MAX_BATCH):
                    await self._send_one(batch[i:i + MAX_BATCH])
        except BaseException as exc:  # every caller gets an answer, whatever happened
            if not batch:
                batch, self._queue = self._queue, []
            for _, fut in batch:
                if not fut.done():
                    if isinstance(exc, asyncio.CancelledError):
                        fut.cancel()
                    else:
                        fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _direct(self) -> bool:
        """Whether the gateway is no cluster router (its /health lists replicas; asked once): a router
        places each ``start_session`` on a replica of its own choosing, a batch would land on one."""
        if self.direct is None:
            self.direct = "replicas" not in await self.client.health()
        return self.direct

    async def _send_one(self, batch: list[tuple[str, asyncio.Future[SessionHandle]]], *,
                        single: bool = False) -> None:
        """One call for ``batch``; an error of the whole call propagates to :meth:`_send`."""
        results: list[SessionHandle | GatewayClientError]
        if single:
            try:
                results = [await self.client.start_session(batch[0][0])]
            except GatewayClientError as exc:  # that start's own answer
                results = [exc]
        else:
            self.calls += 1
            results = await self.client.start_sessions([task_id for task_id, _ in batch])
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
        """Cancel the batches still gathering or on the wire (their callers are cancelled)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
