"""The one supervised background loop: it outlives failing passes, logs them, and ends only when cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from helpers import eventually
from rlgate.supervised import forever


def test_a_failing_pass_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def one_pass() -> None:
        calls.append(len(calls))
        if len(calls) <= 3:
            raise RuntimeError(f"boom {len(calls)}")

    async def main() -> None:
        task = asyncio.create_task(forever(one_pass, wait=0, what="the test pass", log=logging.getLogger("t")))
        await eventually(lambda: len(calls) >= 5, what="five passes")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="t"):
        asyncio.run(main())
    failed = [r for r in caplog.records if r.getMessage().startswith("the test pass failed")]
    assert [r.getMessage() for r in failed] == [
        "the test pass failed", "the test pass failed (2 times in a row)", "the test pass failed (3 times in a row)"]
    assert all(r.exc_info and "boom" in str(r.exc_info[1]) for r in failed)


def test_a_coroutine_pass_and_an_event_wait() -> None:
    wake = asyncio.Event()
    seen: list[str] = []

    async def woken() -> None:
        await wake.wait()
        wake.clear()

    async def one_pass() -> None:
        await asyncio.sleep(0)
        seen.append("pass")

    async def main() -> None:
        task = asyncio.create_task(forever(one_pass, wait=woken, what="p", log=logging.getLogger("t")))
        for _ in range(100):
            await asyncio.sleep(0)
        assert seen == []  # nothing before the first wake
        wake.set()
        await eventually(lambda: seen == ["pass"], what="one pass after the wake")
        wake.set()
        await eventually(lambda: seen == ["pass", "pass"], what="a second pass after the second wake")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    asyncio.run(main())


def test_at_once_runs_the_first_pass_before_any_wait() -> None:
    seen: list[int] = []

    async def never() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.create_task(forever(lambda: seen.append(1), wait=never, what="p", log=logging.getLogger("t"),
                                           at_once=True))
        await eventually(lambda: seen == [1], what="the first pass")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
