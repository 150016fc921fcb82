"""Weight updates across replicas: one barrier, so agents never notice.

``update(path)``, one at a time:

1. **pause** every live replica (in parallel): admission paused (generation requests wait
   at the door), in-flight generation paused inside each engine. From here until step 3 no
   replica produces a token.
2. **load** the checkpoint on every paused replica (in parallel) as the next version (one
   more than the newest any replica had: a replica that missed an update catches up).
   Tokens generated before the pause keep the old version, tokens after the
   resume carry the new one: a request in flight across the update records both.
3. **resume** every paused replica (always, also after a failure): generation continues
   where it stopped, then admission reopens.

The update succeeds when every live replica loaded the checkpoint and all report the same
new version. A replica that failed to load is marked ``stale`` (it keeps its old weights,
gets no new sessions; its live sessions go on with tokens tagged with its old version)
and the update raises; the next successful update brings it back. A replica that is down
during an update reloads the last completed checkpoint when Ray restarts it (the replica
records it in its store), so it comes back at the cluster's version.

Nothing in this file is on the data path: the controller talks to the replica actors
through Ray only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rlgate.cluster.directory import ReplicaTable
from rlgate.errors import InvalidRequest, Unavailable

log = logging.getLogger("rlgate.cluster.controller")


class WeightUpdateFailed(Unavailable):
    pass


class WeightController:
    def __init__(self, actors: list[Any], table: ReplicaTable, *, call_timeout: float = 600.0) -> None:
        self.actors = actors  # Ray actor handles of the replicas, by index
        self.table = table
        self.call_timeout = call_timeout
        self._lock = asyncio.Lock()
        self.history: list[dict[str, Any]] = []  # one entry per update: version, seconds, replicas

    async def _call(self, index: int, method: str, *args: Any) -> Any:
        ref = getattr(self.actors[index], method).remote(*args)
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.call_timeout)

    async def update(self, path: str) -> int:
        if not path:
            raise InvalidRequest("path: a checkpoint directory is required", param="path")
        async with self._lock:
            t0 = time.perf_counter()
            await self.table.refresh()
            live = [r.index for r in self.table.replicas if r.state != "down"]
            if not live:
                raise WeightUpdateFailed("no replica is up: weights not updated", code="no_replica")
            # ---------------------------------------------------------------- 1. pause
            paused: list[int] = []
            results = await asyncio.gather(*(self._call(i, "pause") for i in live), return_exceptions=True)
            for i, res in zip(live, results, strict=True):
                if isinstance(res, BaseException):
                    log.warning("replica %d could not be paused (%s): left out of this update", i, res)
                else:
                    paused.append(i)
            t_paused = time.perf_counter()
            target = max(self.table.replicas[i].version for i in live) + 1
            try:
                # ------------------------------------------------------------ 2. load
                loaded = await asyncio.gather(*(self._call(i, "load", path, target) for i in paused), return_exceptions=True)
                versions: dict[int, int] = {}
                failed: dict[int, str] = {}
                for i, res in zip(paused, loaded, strict=True):
                    if isinstance(res, BaseException):
                        failed[i] = _short(res)
                    else:
                        versions[i] = int(res)
                for i, why in failed.items():
                    await self._mark(i, "stale", f"weight update from {path} failed: {why}")
                if len(set(versions.values())) > 1:  # e.g. a replica restarted mid-update
                    newest = max(versions.values())
                    for i, v in versions.items():
                        if v != newest:
                            await self._mark(i, "stale", f"at weight version {v}, the cluster is at {newest}")
                t_loaded = time.perf_counter()
            finally:
                # ------------------------------------------------------------ 3. resume
                resumed = await asyncio.gather(*(self._call(i, "resume") for i in paused), return_exceptions=True)
                for i, res in zip(paused, resumed, strict=True):
                    if isinstance(res, BaseException):
                        log.error("replica %d could not be resumed: %s", i, res)
            await self.table.refresh()
            if not versions or failed:
                detail = "; ".join(f"replica {i}: {w}" for i, w in failed.items()) or "no replica loaded it"
                raise WeightUpdateFailed(f"weight update from {path} failed on {len(failed)} of {len(paused)} "
                                         f"replicas ({detail}); those serve their old weights and take no new "
                                         "sessions until an update succeeds", code="weight_update_failed")
            version = max(versions.values())
            for i, v in versions.items():
                if self.table.replicas[i].state == "stale" and v == version:
                    await self._mark(i, "healthy", "")
            entry: dict[str, Any] = {"version": version, "path": path, "replicas": len(versions),
                     "pause_s": t_paused - t0, "load_s": t_loaded - t_paused, "total_s": time.perf_counter() - t0}
            self.history.append(entry)
            log.info("weights updated on %d replicas: version %d (%.2f s)", len(versions), version, entry["total_s"])
            return version

    async def _mark(self, index: int, state: str, reason: str) -> None:
        try:
            await self._call(index, "mark", state, reason)
        except Exception as exc:  # noqa: BLE001 - it is down: the table shows it
            log.warning("replica %d: could not mark it %s: %s", index, state, exc)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]
