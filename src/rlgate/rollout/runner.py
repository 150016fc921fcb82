"""Rollout: GRPO groups of episodes, one gateway session per episode.

For each prompt of a dataset the runner plays a *group* of ``group_size`` episodes (the
GRPO group), with at most ``concurrency`` episodes in flight. An episode is::

    start_session -> agent.run(data, base_url, api_key) -> rewards -> end_session -> export

The agent's return value sets the rewards (a float rewards the last interaction; a dict
rewards the given interaction ids). An episode whose agent raises, times out, or returns
garbage loses only itself: its session is ended and discarded, it is counted, and the run
goes on.

Admission (staleness control): with an :class:`Allowance`, an episode starts only when
the trainer has allowed it (the trainer raises the allowance by one step's worth of
episodes per new policy version and grants the same capacity on the gateway, whose
``granted`` capacity mode enforces it server-side). A ``start_session`` answered 429
(no capacity) is retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.client.gateway import GatewayClient, GatewayClientError
from rlgate.rollout.agent import AgentError, AgentResult, run_inline, run_subprocess

log = logging.getLogger("rlgate.rollout")

AgentFactory = Callable[[str, dict[str, Any]], Any]  # (group_id, data) -> agent


@dataclass
class Episode:
    group_id: str
    index: int  # member index within the group
    data: dict[str, Any]
    session_id: str | None = None
    ok: bool = False
    error: str | None = None
    result: AgentResult | None = None  # what the agent returned
    samples: list[dict[str, Any]] = field(default_factory=list)  # exported training samples
    stats: dict[str, Any] = field(default_factory=dict)  # export stats (extend / fork counts...)
    seconds: float = 0.0

    @property
    def reward(self) -> float | None:
        """The episode's return: the float the agent returned, or the sum of its dict."""
        if isinstance(self.result, dict):
            return float(sum(self.result.values()))
        return self.result

    @property
    def generated_tokens(self) -> int:
        return sum(sum(s["loss_mask"]) for s in self.samples)


@dataclass
class Group:
    group_id: str
    data: dict[str, Any]
    episodes: list[Episode]

    @property
    def ok(self) -> list[Episode]:
        return [e for e in self.episodes if e.ok]


class Allowance:
    """How many more episodes may start (raised by the trainer, consumed by the runner)."""

    def __init__(self, initial: int = 0) -> None:
        self._left = initial
        self._waiting = 0
        self._cond = asyncio.Condition()

    async def grant(self, n: int) -> None:
        async with self._cond:
            self._left += n
            self._cond.notify_all()

    async def acquire(self) -> None:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: self._left > 0)
            finally:
                self._waiting -= 1
            self._left -= 1

    @property
    def left(self) -> int:
        return self._left

    @property
    def waiting(self) -> int:
        """Episodes waiting for an admission now."""
        return self._waiting


@dataclass
class RolloutCounters:
    started: int = 0
    completed: int = 0
    failed: int = 0  # agent raised / returned garbage / gateway refused
    timed_out: int = 0


class RolloutRunner:
    def __init__(
        self,
        client: GatewayClient,
        agent: Any | AgentFactory,
        *,
        group_size: int = 8,
        concurrency: int = 64,
        episode_timeout: float = 120.0,
        mode: Literal["inline", "subprocess", "ray"] = "inline",
        export_style: Literal["individual", "concat"] = "individual",
        discount: float = 1.0,
        allowance: Allowance | None = None,
        ray_options: dict[str, Any] | None = None,
        collector: Any = None,
    ) -> None:
        """``ray_options``: mode ``ray`` only, the resource request of each episode's Ray task
        (default ``{"num_cpus": 1}``; see ``rollout/ray_mode.py``). ``collector``: a
        :class:`~rlgate.cluster.collector.Collector`; episodes then get their export from it (one
        stream per replica) instead of exporting their session themselves."""
        self.client = client
        self._agent_for: AgentFactory = agent if _is_factory(agent) else (lambda gid, data: agent)
        self.group_size = group_size
        self.episode_timeout = episode_timeout
        self.mode = mode
        self.export_style = export_style
        self.discount = discount
        self.allowance = allowance
        self.collector = collector
        self.counters = RolloutCounters()
        self._sem = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._http: Any = None
        self._ray: Any = None
        if mode == "ray":
            from rlgate.rollout.ray_mode import RayEpisodes

            self._ray = RayEpisodes(ray_options)

    def http_client(self) -> Any:
        """One HTTP client shared by every inline agent's SDK client.

        Building an OpenAI / Anthropic SDK client creates a fresh HTTP client and SSL
        context (~20 ms of CPU); sharing one makes that ~0.1 ms. Both SDKs (openai >= 2,
        anthropic >= 1) take an ``httpx2.AsyncClient``; with older SDKs agents get None
        and build their own.
        """
        if self._http is None:
            try:
                import httpx2
            except ImportError:
                return None
            n = self._concurrency + 8
            self._http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(self.episode_timeout, connect=10.0),
                limits=httpx2.Limits(max_connections=n, max_keepalive_connections=n),
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # ------------------------------------------------------------------ one episode

    async def _start_session(self, task_id: str) -> Any:
        delay = 0.01
        while True:
            try:
                return await self.client.start_session(task_id)
            except GatewayClientError as exc:
                if exc.status != 429:
                    raise
                await asyncio.sleep(delay)  # no capacity yet: the trainer grants more per version
                delay = min(delay * 2, 0.5)

    async def episode(self, group_id: str, index: int, data: dict[str, Any], *, admit: bool = True) -> Episode:
        ep = Episode(group_id, index, data)
        if admit and self.allowance is not None:
            await self.allowance.acquire()
        async with self._sem:
            t0 = time.perf_counter()
            self.counters.started += 1
            session = None
            try:
                session = await self._start_session(f"{group_id}")
                ep.session_id = session.session_id
                agent = self._agent_for(group_id, data)
                kwargs = dict(base_url=self.client.base_url, api_key=session.api_key, timeout=self.episode_timeout)
                if self.mode == "subprocess":
                    ep.result = await run_subprocess(agent, data, **kwargs)
                elif self.mode == "ray":
                    ep.result = await self._ray.run(agent, data, **kwargs)
                else:
                    ep.result = await run_inline(agent, data, http_client=self.http_client(), **kwargs)
                if isinstance(ep.result, dict):
                    for iid, r in ep.result.items():
                        await session.set_reward(r, interaction_id=iid)
                else:
                    await session.set_reward(ep.result)
                if self.collector is not None:
                    collected = self.collector.expect(session.session_id)
                    try:
                        await session.end()
                        export = await asyncio.wait_for(collected, self.episode_timeout)
                    finally:
                        collected.cancel()
                else:
                    await session.end()
                    export = await session.export(style=self.export_style, discount=self.discount)
                ep.samples, ep.stats, ep.ok = export["interactions"], export["stats"], True
                self.counters.completed += 1
            except Exception as exc:  # noqa: BLE001 - a failure loses only this episode (cancellation propagates)
                ep.error = str(exc) if isinstance(exc, (AgentError, GatewayClientError)) else (
                    f"{type(exc).__name__}: {exc}")
                if "timed out" in ep.error:
                    self.counters.timed_out += 1
                self.counters.failed += 1
                log.warning("episode %s/%d dropped: %s", group_id, index, ep.error)
                await self._discard(session)
            finally:
                ep.seconds = time.perf_counter() - t0
        return ep

    async def _discard(self, session: Any) -> None:
        """End and drop a failed episode's session, so its key is retired and memory freed."""
        if session is None:
            return
        collected = self.collector.expect(session.session_id) if self.collector is not None else None
        try:
            await session.end()
            if collected is not None:  # the collector takes it (and it is dropped here), not the trainer
                await asyncio.wait_for(collected, self.episode_timeout)
            else:
                await session.export()
        except Exception:  # noqa: BLE001 - best effort; the gateway's sweeper retires it otherwise
            pass
        finally:
            if collected is not None:
                collected.cancel()

    # ------------------------------------------------------------------ groups

    async def group(self, group_id: str, data: dict[str, Any], *, admit: bool = True) -> Group:
        episodes = await asyncio.gather(
            *(self.episode(group_id, i, data, admit=admit) for i in range(self.group_size))
        )
        return Group(group_id, data, list(episodes))

    async def groups(self, items: Iterable[tuple[str, dict[str, Any]]], *, max_groups_in_flight: int = 64
                     ) -> AsyncIterator[Group]:
        """Play a group per item, yielding groups as they complete (not in order)."""
        pending: set[asyncio.Task[Group]] = set()
        it = iter(items)
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < max_groups_in_flight:
                    try:
                        gid, data = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.add(asyncio.create_task(self.group(gid, data)))
                if not pending:
                    return
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    yield t.result()
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def evaluate(self, items: list[dict[str, Any]], *, group_id: str = "eval",
                       grant_capacity: bool = True) -> list[Episode]:
        """One episode per item, outside the trainer's allowance (capacity granted here)."""
        if grant_capacity:
            await self.client.grant_capacity(len(items))
        return list(await asyncio.gather(
            *(self.episode(f"{group_id}-{i}", 0, d, admit=False) for i, d in enumerate(items))))


def _is_factory(obj: Any) -> bool:
    return callable(obj) and not hasattr(obj, "run")
