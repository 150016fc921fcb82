"""Which weights each backend holds: updates, rollbacks, health checks and rejoining.

* **Updates.** :meth:`BackendWeights.update` pauses every eligible backend, loads the
  checkpoint on all of them, **checks** what each now serves against the checkpoint's probe
  (engine/weight_check.py; the backends are resumed for it while the gateway's door stays
  shut, see :mod:`.verify`), and bumps the version only if every one loaded it and passed. On
  a partial failure every backend that loaded it, or failed part-way, is rolled back to the
  previous checkpoint (one that refused it kept its weights) and checked against that
  checkpoint's probe when it had one; a backend whose rollback fails, or whose previous
  checkpoint is unknown, is quarantined (``stale``: no traffic) until a later update or a
  health check resyncs it. Generation resumes in every case.
* **Health.** :meth:`BackendWeights.check_all` (run every ``health_interval`` seconds by
  the engine's health loop) sends ``GET /health`` to every backend. A backend that fails
  is marked down: it gets no new sessions. A reachable backend that is not eligible
  rejoins once its weights are the current version, reloaded from the current checkpoint
  (and checked) if needed. So a backend serves traffic only while it holds the gateway's
  current version.
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
from rlgate.engine.remote.verify import CheckWindow, check_backend
from rlgate.engine.weight_check import DEFAULT_TOLERANCE, WeightCheck, WeightCheckFailed, WeightProbe
from rlgate.supervised import forever

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

    def __init__(self, pool: BackendPool, hooks: BackendHooks, *, health_timeout: float,
                 tolerance: float | None = DEFAULT_TOLERANCE) -> None:
        self.pool = pool
        self.hooks = hooks
        self.health_timeout = health_timeout
        self.tolerance = tolerance  # of the weight check (None: no check)
        self.probe: WeightProbe | None = None  # the probe of the current version's checkpoint, if it had one
        self.window: CheckWindow | None = None  # a weight check in progress
        self.rejected_epoch = 0  # pause epoch of the last update whose check failed
        self.last_check: WeightCheck | None = None
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
        await forever(self.check_all, wait=interval, what=f"{self.hooks.kind} health check", log=log)

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
                if self.probe is not None and self.tolerance is not None:  # out of rotation: probed as it is
                    _, err = await check_backend(hooks, b, self.probe, path, self.tolerance)
                    if err is not None:
                        b.dirty = True
                        b.set_state("stale", f"rejoin: {describe_exc(err)}")
                        return
            await hooks.restore_adapters(b)  # the LoRA adapters served (engine/remote/adapters.py)
            b.version = pool.version
            b.dirty = False
            b.set_state("healthy")
            log.info("backend %s rejoined at weight version %d", b.url, pool.version)
        except (*_BACKEND_FAILURES, WeightUpdateError) as exc:
            b.set_state("stale" if b.dirty else "down", f"rejoin failed: {describe_exc(exc)}")

    # ------------------------------------------------------------------ updates

    async def update(self, path: str, probe: WeightProbe | None = None) -> int:
        """Load ``path`` on every eligible backend, check what they serve against ``probe`` (the
        checkpoint's, if it has one), and bump the version only if all of them loaded it and passed."""
        async with self.lock:
            return await self._update(path, probe)

    async def _update(self, path: str, probe: WeightProbe | None) -> int:
        pool, hooks = self.pool, self.hooks
        targets = [b for b in pool.backends if pool.eligible(b)]
        if not targets:
            raise WeightUpdateError(f"no {hooks.kind} backend is available to load {path}; the weights are "
                                    f"unchanged (version {pool.version})", status=503, code="backend_unavailable")
        old_version, new_version = pool.version, pool.version + 1
        new_label = hooks.label_for(new_version)
        t0 = time.perf_counter()
        paused: set[Backend] = set()  # paused by this update: resumed at its end
        self.pause.hold()
        try:
            to_pause = [b for b in targets if b not in self.pause.held]  # the engine's own pause holds the rest
            results = await asyncio.gather(*(self._pause(b) for b in to_pause))
            paused = {b for b, ok in zip(to_pause, results, strict=True) if ok}
            errors = await asyncio.gather(*(self._load(b, path, new_label) for b in targets))
            failed = [(b, e) for b, e in zip(targets, errors, strict=True) if e is not None]
            if not failed:
                failed = await self._check(targets, paused, path, probe)
            if not failed:
                for b in targets:
                    if hooks.reports_labels:
                        b.labels[new_label] = new_version
                        b.label = new_label
                    b.version = new_version
                pool.version, pool.path = new_version, path
                self.probe = probe
                self._close_window(True)  # events held back during the check go on, tagged new_version
                for b in pool.backends:
                    if b not in targets:
                        b.dirty = True
                        log.warning("backend %s was not updated (%s); it is resynced before it rejoins", b.url,
                                    b.state)
                log.info("%s: loaded %s on %d backend(s) in %.1f s; weight version %d (%s)", hooks.kind, path,
                         len(targets), time.perf_counter() - t0, new_version,
                         "checked" if probe is not None and self.tolerance is not None else "not checked")
                return new_version
            raise await self._roll_back(targets, paused, failed, path, old_version)
        finally:
            self._close_window(False)  # still open only if something above raised
            await asyncio.gather(*(self._resume(b) for b in paused))
            self.pause.release()

    def _close_window(self, passed: bool) -> None:
        window, self.window = self.window, None
        if window is not None:
            if not passed:  # requests that ran across it may hold tokens of weights that were not kept
                self.rejected_epoch = max(self.rejected_epoch, window.epoch)
            window.close(passed)

    async def _check(self, targets: list[Backend], paused: set[Backend], path: str, probe: WeightProbe | None
                     ) -> list[tuple[Backend, BaseException]]:
        """Probe every target on its new weights (engine/remote/verify.py); [] if all passed (or there is
        nothing to check). The window opened here stays open until the caller bumps the version."""
        if probe is None or self.tolerance is None:
            why = "the checkpoint has no probe" if probe is None else "weight checks are off"
            self.last_check = WeightCheck(path, passed=True, skipped=why, where=self.hooks.kind)
            return []
        t0 = time.perf_counter()
        self.window = CheckWindow(self.pause.epoch)
        stopped = [b for b in targets if b in paused or b in self.pause.held]
        await asyncio.gather(*(self._resume(b) for b in stopped))  # servers generate nothing while paused
        paused.difference_update(stopped)
        outcomes = await asyncio.gather(*(check_backend(self.hooks, b, probe, path, self.tolerance)
                                          for b in targets))
        checks = [c for c, _ in outcomes if c is not None]
        failed = [(b, e) for b, (_, e) in zip(targets, outcomes, strict=True) if e is not None]
        worst = max(checks, key=lambda c: c.max_diff, default=None)
        self.last_check = WeightCheck(
            path, passed=not failed, max_diff=worst.max_diff if worst else float("nan"),
            mean_diff=max((c.mean_diff for c in checks), default=float("nan")), tolerance=self.tolerance,
            tokens=len(probe.logprobs), where=self.hooks.kind, seconds=time.perf_counter() - t0,
            per_backend={b.url: _outcome(c, e) for b, (c, e) in zip(targets, outcomes, strict=True)})
        if failed:  # requests that ran across this update may hold tokens of the rejected weights: they fail
            self._close_window(False)
        # back to how the update found them: paused by it (rolled back next) or by the engine's own pause
        again = [b for b in stopped if failed or b in self.pause.held]
        results = await asyncio.gather(*(self._pause(b) for b in again))
        paused.update(b for b, ok in zip(again, results, strict=True) if ok and b not in self.pause.held)
        return failed

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

    async def _roll_back(self, targets: list[Backend], paused: set[Backend], failed: list[tuple[Backend, BaseException]],
                         path: str, old_version: int) -> WeightUpdateError:
        """Put every backend that may have changed back on the previous weights (checked against their
        probe when it is known); quarantine the rest."""
        hooks = self.hooks
        refused = {b for b, e in failed if isinstance(e, LoadRefused)}
        notes = [_note(b, e) for b, e in failed]
        restored: list[Backend] = []
        quarantined: list[str] = []
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
                restored.append(b)
            else:
                self._quarantine(b, f"weights unknown after a failed update to {path}; rollback failed: "
                                    f"{describe_exc(err)}")
                quarantined.append(b.url)
        if restored and self.probe is not None and self.tolerance is not None:
            for b, why in await self._recheck(restored, paused, self.probe, self.pool.path or "the launch weights"):
                restored.remove(b)
                self._quarantine(b, f"rolled back after a failed update to {path}, but {why}")
                quarantined.append(b.url)
        msg = (f"weight update to {path} failed on {len(failed)} of {len(targets)} {hooks.kind} backend(s): "
               f"{'; '.join(notes)}. The gateway keeps weight version {old_version}")
        if restored:
            msg += f"; rolled back to the previous weights: {', '.join(b.url for b in restored)}"
        if quarantined:
            msg += (f"; out of rotation until resynced (their weights are not version {old_version}): "
                    f"{', '.join(quarantined)}")
        log.error(msg)
        checks = any(isinstance(e, WeightCheckFailed) for _, e in failed)
        return WeightUpdateError(msg, status=502, code="weight_check_failed" if checks else "backend_error")

    def _quarantine(self, b: Backend, why: str) -> None:
        b.dirty = True
        b.set_state("stale", why)

    async def _recheck(self, backends: list[Backend], paused: set[Backend], probe: WeightProbe, path: str
                       ) -> list[tuple[Backend, str]]:
        """Check ``backends`` against ``probe`` outside an update's window (a rollback, a rejoin):
        resumed to be probed, paused again if they were. (backend, why) for each that failed."""
        assert self.tolerance is not None
        stopped = [b for b in backends if b in paused or b in self.pause.held]
        await asyncio.gather(*(self._resume(b) for b in stopped))
        outcomes = await asyncio.gather(*(check_backend(self.hooks, b, probe, path, self.tolerance)
                                          for b in backends))
        results = await asyncio.gather(*(self._pause(b) for b in stopped))
        paused.difference_update(b for b, ok in zip(stopped, results, strict=True) if not ok)
        return [(b, describe_exc(e)) for b, (_, e) in zip(backends, outcomes, strict=True) if e is not None]

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


def _outcome(check: WeightCheck | None, error: BaseException | None) -> dict[str, object]:
    """One backend's line in the check's report."""
    if check is not None:
        return check.describe()
    return {"result": "error", "error": describe_exc(error) if error is not None else "unknown"}


def _note(b: Backend, error: BaseException) -> str:
    text = describe_exc(error)
    return text if text.startswith(b.url) or b.url in text[:200] else f"{b.url}: {text}"
