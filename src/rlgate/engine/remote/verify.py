"""Checking what a backend serves after it loaded a checkpoint (engine/weight_check.py).

SGLang and vLLM generate nothing while paused, so a backend is **resumed** to be probed, while
the gateway keeps its own door shut (no new request reaches any backend until the update is
over). What can still run on a resumed backend are the requests its pause mode held (SGLang
``retract`` / ``in_place``, vLLM ``keep``): their new tokens come from the weights under check.
A :class:`CheckWindow` is open meanwhile: the engine holds back every event of a request sent
before the update (``epoch`` below the window's) until the check's verdict. If the check fails,
every such request still running fails (503 ``backend_stale``: some of its tokens may come from
the rejected weights), so no token of rejected weights is ever passed on or tagged with a version.
Server kinds whose pause ends every request in flight (vLLM ``abort`` / ``wait``) have none.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from rlgate.engine.remote.backend import Backend, BackendHooks
from rlgate.engine.remote.errors import BackendFailed, BackendRejected, MalformedResponse, describe_exc
from rlgate.engine.weight_check import WeightCheck, WeightCheckFailed, WeightProbe, compare, failure_message

__all__ = ["CheckWindow", "check_backend"]


class CheckWindow:
    """A weight check in progress (see the module docstring)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch  # the update's pause epoch: requests sent before it ran across the update
        self.passed = False
        self._done = asyncio.Event()

    def close(self, passed: bool) -> None:
        if not self._done.is_set():
            self.passed = passed
            self._done.set()

    async def verdict(self) -> bool:
        await self._done.wait()
        return self.passed


async def check_backend(hooks: BackendHooks, b: Backend, probe: WeightProbe, path: str, tolerance: float
                        ) -> tuple[WeightCheck | None, BaseException | None]:
    """Score ``probe`` on ``b`` and compare: (the check, None) if it passed, else (the check or None,
    the error that fails the update)."""
    t0 = time.perf_counter()
    try:
        served = await hooks.score_backend(b, list(probe.input_ids))
        check = compare(probe, served, path=path, tolerance=tolerance, where=f"{hooks.kind} backend {b.url}")
    except (httpx.HTTPError, BackendRejected, MalformedResponse) as exc:
        return None, BackendFailed(f"{b.url}: the weight check could not score the probe: {describe_exc(exc)}")
    except WeightCheckFailed as exc:
        return None, exc
    check.seconds = time.perf_counter() - t0
    if not check.passed:
        return check, WeightCheckFailed(failure_message(check))
    return check, None
