"""Which weights each backend holds: updates, rollbacks, health checks and rejoining.

* **Updates.** :meth:`BackendWeights.update` pauses every eligible backend, loads the
  checkpoint on all of them, and bumps the version only if every one succeeded. On a
  partial failure every backend that loaded it, or failed part-way, is rolled back to the
  previous checkpoint (one that refused it kept its weights); a backend whose rollback
  fails, or whose previous checkpoint is unknown, is quarantined (``stale``: no traffic)
  until a later update or a health check resyncs it. Generation resumes in every case.
* **Health.** :meth:`BackendWeights.check_all` (run every ``health_interval`` seconds by
  the engine's health loop) sends ``GET /health`` to every backend. A backend that fails
  is marked down: it gets no new sessions. A reachable backend that is not eligible
  rejoins once its weights are the current version, reloaded from the current checkpoint
  if needed. So a backend serves traffic only while it holds the gateway's current version.
* **Pauses.** :class:`GenerationPause` says whether generation is paused (by an update, or by
  the engine's ``pause_generation`` for a cluster-wide barrier) and counts pauses (``epoch``), so
  the engine tells a request aborted *by a pause* (resumed from its prefix) from one aborted
  for another reason (an error). Backends the engine paused itself (``held``) are not paused
  again, nor resumed, by an update that runs inside that pause.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from rlgate.engine.base import WeightUpdateError
from rlgate.engine.remote.backend import Backend, BackendHooks
from rlgate.engine.remote.errors import BackendRejected, LoadRefused, MalformedResponse, describe_exc
from rlgate.engine.remote.pool import BackendPool

__all__ = ["BackendWeights", "GenerationPause"]

log = logging.getLogger("rlgate.engine.remote")

# What a backend's weight protocol raises when a step fails (the update or rejoin handles it).
_BACKEND_FAILURES = (httpx.HTTPError, BackendRejected, MalformedResponse)


class GenerationPause:
    """Whether generation is paused, and how many pauses began so far (``epoch``)."""

    def __init__(self) -> None:
        self.epoch = 0  # +1 at every pause: a request started in an older epoch may have been aborted by it
        self.holders = 0  # pauses in progress (an engine-level pause and the update inside it)
        self.held: list[Backend] = []  # backends paused by the engine-level pause
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def paused(self) -> bool:
        return self.holders > 0

    def _resumed(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._event is None or self._loop is not loop:
            self._event, self._loop = asyncio.Event(), loop
            if not self.holders:
                self._event.set()
        return self._event

    def hold(self) -> None:
        self.epoch += 1
        self.holders += 1
        self._resumed().clear()

    def release(self) -> None:
        self.holders = max(0, self.holders - 1)
        if not self.holders:
            self._resumed().set()

    async def wait(self) -> None:
        """Return once generation is not paused."""
        while self.holders:
            await self._resumed().wait()


class BackendWeights:
    """Keeps every serving backend on the gateway's weight version (see the module docstring)."""

    def __init__(self, pool: BackendPool, hooks: BackendHooks, *, health_timeout: float) -> None:
        self.pool = pool
        self.hooks = hooks
        self.health_timeout = health_timeout
        self._lock: asyncio.Lock | None = None  # one update or rejoin at a time
        self.pause = GenerationPause()
        self._paused_by_engine = False

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    # ------------------------------------------------------------------ health

    async def health_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_all()
            except Exception:  # the loop must never die: log and check again next round
                log.exception("%s health check failed", self.hooks.kind)

    async def check_all(self) -> None:
        """One round of health checks."""
        await asyncio.gather(*(self.check(b) for b in self.pool.backends))

    async def _health(self, b: Backend) -> str | None:
        """None if healthy, else why not."""
        try:
            r = await self.pool.call(b, "GET", self.pool.health_path, timeout=self.health_timeout)
        except httpx.HTTPError as exc:
            return f"health check: {describe_exc(exc)}"
        if r.status_code != 200:
            return f"health check: HTTP {r.status_code}"
        return None

    async def check(self, b: Backend) -> None:
        why = await self._health(b)
        if why is not None:
            if b.state != "down":
                b.set_state("down", why)
            return
        if self.pool.eligible(b) or self.lock.locked():
            return  # serving, or an update is running and decides about this backend
        async with self.lock:
            await self._rejoin(b)

    async def _rejoin(self, b: Backend) -> None:
        """Bring a reachable backend back once its weights are the current version."""
        pool, hooks = self.pool, self.hooks
        try:
            await hooks.probe_backend(b)
            b.probed = True
            if b.dirty:
                in_sync = False
            elif b.label is not None and b.label in b.labels:
                in_sync = b.labels[b.label] == pool.version
            else:  # no label (vLLM): it may have restarted with its launch weights
                in_sync = pool.version == 0
            if not in_sync:
                path = pool.path or b.model_path
                if path is None:
                    b.dirty = True
                    b.set_state("stale", "its weights are not the current version and no checkpoint is known")
                    return
                label = hooks.label_for(pool.version)
                log.info("backend %s: loading %s (version %d) before it rejoins", b.url, path, pool.version)
                await hooks.load_weights(b, path, label)
                if hooks.reports_labels:
                    b.labels[label] = pool.version
                    b.label = label
            b.version = pool.version
            b.dirty = False
            b.set_state("healthy")
            log.info("backend %s rejoined at weight version %d", b.url, pool.version)
        except (*_BACKEND_FAILURES, WeightUpdateError) as exc:
            b.set_state("stale" if b.dirty else "down", f"rejoin failed: {describe_exc(exc)}")

    # ------------------------------------------------------------------ updates

    async def update(self, path: str) -> int:
        """Load ``path`` on every eligible backend; bump the version only if all succeeded."""
        async with self.lock:
            return await self._update(path)

    async def _update(self, path: str) -> int:
        pool, hooks = self.pool, self.hooks
        targets = [b for b in pool.backends if pool.eligible(b)]
        if not targets:
            raise WeightUpdateError(f"no {hooks.kind} backend is available to load {path}; the weights are "
                                    f"unchanged (version {pool.version})", status=503)
        old_version, new_version = pool.version, pool.version + 1
        new_label = hooks.label_for(new_version)
        t0 = time.perf_counter()
        paused: list[Backend] = []
        self.pause.hold()
        try:
            to_pause = [b for b in targets if b not in self.pause.held]  # the engine's own pause holds the rest
            results = await asyncio.gather(*(self._pause(b) for b in to_pause))
            paused = [b for b, ok in zip(to_pause, results, strict=True) if ok]
            errors = await asyncio.gather(*(self._load(b, path, new_label) for b in targets))
            failed = [(b, e) for b, e in zip(targets, errors, strict=True) if e is not None]
            if not failed:
                for b in targets:
                    if hooks.reports_labels:
                        b.labels[new_label] = new_version
                        b.label = new_label
                    b.version = new_version
                pool.version, pool.path = new_version, path
                for b in pool.backends:
                    if b not in targets:
                        b.dirty = True
                        log.warning("backend %s was not updated (%s); it is resynced before it rejoins", b.url,
                                    b.state)
                log.info("%s: loaded %s on %d backend(s) in %.1f s; weight version %d", hooks.kind, path,
                         len(targets), time.perf_counter() - t0, new_version)
                return new_version
            raise await self._roll_back(targets, failed, path, old_version)
        finally:
            await asyncio.gather(*(self._resume(b) for b in paused))
            self.pause.release()

    async def pause_all(self) -> None:
        """Pause generation on every serving backend until :meth:`resume_all` (the engine's
        ``pause_generation``). Updates that run meanwhile load weights without pausing again."""
        async with self.lock:
            if self._paused_by_engine:
                return
            self._paused_by_engine = True
            self.pause.hold()
            targets = [b for b in self.pool.backends if self.pool.eligible(b)]
            results = await asyncio.gather(*(self._pause(b) for b in targets))
            self.pause.held = [b for b, ok in zip(targets, results, strict=True) if ok]

    async def resume_all(self) -> None:
        """Continue generation after :meth:`pause_all`."""
        if not self._paused_by_engine:
            return
        held, self.pause.held = self.pause.held, []
        self._paused_by_engine = False
        await asyncio.gather(*(self._resume(b) for b in held))
        self.pause.release()

    async def _roll_back(self, targets: list[Backend], failed: list[tuple[Backend, BaseException]], path: str,
                         old_version: int) -> WeightUpdateError:
        """Put every backend that may have changed back on the previous weights; quarantine the rest."""
        hooks = self.hooks
        refused = {b for b, e in failed if isinstance(e, LoadRefused)}
        notes = [f"{b.url}: {describe_exc(e)}" for b, e in failed]
        restored, quarantined = [], []
        for b in targets:
            if b in refused:
                continue  # it refused the checkpoint and kept its weights
            back = self.pool.path or b.model_path
            label = next((lab for lab, v in b.labels.items() if v == old_version), hooks.label_for(old_version))
            err: BaseException | None = WeightUpdateError("the previous checkpoint is unknown")
            if back is not None:
                err = await self._load(b, back, label)
            if err is None:
                if hooks.reports_labels:
                    b.label = label
                restored.append(b.url)
            else:
                b.dirty = True
                b.set_state("stale", f"weights unknown after a failed update to {path}; rollback failed: "
                                     f"{describe_exc(err)}")
                quarantined.append(b.url)
        msg = (f"weight update to {path} failed on {len(failed)} of {len(targets)} {hooks.kind} backend(s): "
               f"{'; '.join(notes)}. The gateway keeps weight version {old_version}")
        if restored:
            msg += f"; rolled back to the previous weights: {', '.join(restored)}"
        if quarantined:
            msg += (f"; out of rotation until resynced (their weights are not version {old_version}): "
                    f"{', '.join(quarantined)}")
        log.error(msg)
        return WeightUpdateError(msg, status=502)

    async def _pause(self, b: Backend) -> bool:
        try:
            return await self.hooks.pause_backend(b)
        except _BACKEND_FAILURES as exc:
            log.warning("backend %s: could not pause generation (%s); updating without a pause", b.url,
                        describe_exc(exc))
            return False

    async def _resume(self, b: Backend) -> None:
        try:
            await self.hooks.resume_backend(b)
        except _BACKEND_FAILURES as exc:
            log.error("backend %s: could not resume generation after the update: %s", b.url, describe_exc(exc))
            b.set_state("stale", f"generation could not be resumed: {describe_exc(exc)}")

    async def _load(self, b: Backend, path: str, label: str) -> BaseException | None:
        try:
            await self.hooks.load_weights(b, path, label)
            return None
        except (WeightUpdateError, *_BACKEND_FAILURES) as exc:
            return exc
