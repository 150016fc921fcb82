"""Rollout: GRPO groups of episodes, one gateway session per episode.

For each prompt of a dataset the runner plays a *group* of ``group_size`` episodes (the
GRPO group), with at most ``concurrency`` episodes in flight. An episode is::

    start_session -> agent.run(data, base_url, api_key) -> end_session
        -> [reward_fn(episode)] -> rewards -> export -> typed Samples

Without a reward function (and without a collector) the last three are one control call,
``finish_session`` (end, rewards and export, all or nothing: issue 28 measured the control calls
as the larger part of an episode's cost on the toy model), so an episode is::

    start_session -> agent.run -> finish_session -> typed Samples

and the episodes that start together start their sessions in one ``start_sessions`` call
(``rollout/starts.py``; not through a cluster router, which places each session itself).

The agent's return value sets the rewards (a float rewards the last interaction; a dict
rewards the given interaction ids), unless a reward function scores the episode. The
session is ended first (its interaction count tells whether the agent called the gateway
at all) and rewarded with the admin key. With a collector (``cluster/collector.py``,
replicas on Ray) the export is taken the moment the session ends, so the order is::

    start_session -> agent.run -> rewards -> end_session -> export (from the collector)

and "no LLM call" is read from the export's stats.

Modes (where ``agent.run`` executes): ``inline`` (this event loop), ``subprocess`` (a
process per episode) and ``ray`` (a Ray task per episode, ``rollout/ray_mode.py``).

Failures, by kind (rollout/errors.py):

* an episode whose agent raises or times out, that made no LLM call through the gateway,
  or that the gateway refused, loses only itself: its session is ended and discarded, it
  is counted, and the run goes on. The first failure is logged with its full traceback;
  later ones are counted (``counters``) and logged at DEBUG;
* ``max_consecutive_failures`` failed episodes in a row (e.g. the first N of a run) raise
  :class:`TooManyFailures`, whose message carries the first failure;
* a reward that is not a finite float (or is outside ``reward_range``) is a bug, not bad
  luck: :class:`AgentContractError` at once.

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
import traceback
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.client.gateway import GatewayClient, GatewayClientError
from rlgate.core.sessions import NOTHING_TO_REWARD
from rlgate.rollout.agent import AgentResult, check_result, run_inline, run_subprocess
from rlgate.rollout.errors import AgentError, RunError, TooManyFailures
from rlgate.rollout.starts import BatchedStarts
from rlgate.trajectory.export import DEFAULT_EXPORT_STYLE, NO_DISCOUNT, ExportStyle
from rlgate.trajectory.reward import FinishedEpisode, GroupReward, RewardFn, score_episode, score_group
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.rollout")

# The rollout knobs' defaults, written once: RolloutSettings (train/config.py), the TRL and verl
# adapters and this runner take them from here.
GROUP_SIZE = 8
CONCURRENCY = 64
EPISODE_TIMEOUT_S = 300.0
MAX_CONSECUTIVE_FAILURES = 32

NO_LLM_CALL = ("the episode made no LLM call through the gateway: the agent must send its requests to the "
               "base_url it is given, with the api_key it is given")

AgentFactory = Callable[[str, dict[str, Any]], Any]  # (group_id, data) -> agent


@dataclass
class Episode:
    group_id: str
    index: int  # member index within the group
    data: dict[str, Any]
    session_id: str | None = None
    ok: bool = False
    error: str | None = None
    result: AgentResult | None = None  # the rewards set (the agent's return value, or the reward function's)
    output: Any = None  # what the agent's run() returned
    samples: list[Sample] = field(default_factory=list)  # exported training samples
    stats: dict[str, Any] = field(default_factory=dict)  # export stats (extend / fork counts...)
    seconds: float = 0.0
    exported: bool = False  # the session's export was taken (by the collector): nothing left to discard
    finished: FinishedEpisode | None = None  # what the reward sees (with a reward function)
    awaiting_group: Any = None  # its ended session, while a group-form reward waits for the group's others

    @property
    def reward(self) -> float | None:
        """The episode's return: the float reward, or the sum of the dict."""
        if isinstance(self.result, dict):
            return float(sum(self.result.values()))
        return self.result

    @property
    def generated_tokens(self) -> int:
        return sum(s.generated_tokens for s in self.samples)


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
    failed: int = 0  # agent raised / timed out / made no call / gateway refused
    timed_out: int = 0
    consecutive_failures: int = 0  # since the last completed episode
    first_failure: str | None = None  # "group/index: message" of the run's first failure


class RolloutRunner:
    def __init__(
        self,
        client: GatewayClient,
        agent: Any | AgentFactory,
        *,
        group_size: int = GROUP_SIZE,
        concurrency: int = CONCURRENCY,
        episode_timeout: float = EPISODE_TIMEOUT_S,
        mode: Literal["inline", "subprocess", "ray"] = "inline",
        export_style: ExportStyle = DEFAULT_EXPORT_STYLE,
        discount: float = NO_DISCOUNT,
        allowance: Allowance | None = None,
        reward_fn: RewardFn | None = None,
        reward_range: tuple[float, float] | None = None,
        max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES,
        ray_options: dict[str, Any] | None = None,
        collector: Any = None,
        batch_starts: bool = True,
        fused_finish: bool = True,
    ) -> None:
        """``max_consecutive_failures``: that many failed episodes in a row stop the run (0: never).
        ``ray_options``: mode ``ray`` only, the resource request of each episode's Ray task
        (default ``{"num_cpus": 1}``; see ``rollout/ray_mode.py``). ``collector``: a
        :class:`~rlgate.cluster.collector.Collector`; episodes then get their export from it (one
        stream per replica) instead of exporting their session themselves. The collector takes a
        session's export the moment it ends, so its rewards are set before: a ``reward_fn``, which
        scores the ended episode, does not combine with a collector (ValueError).
        ``batch_starts``: the episodes starting together start their sessions in one call
        (``/rl/start_sessions``, rollout/starts.py; an older gateway that lacks it gets one call per
        episode); False: one call per episode. ``fused_finish``: without a reward function or a
        collector an episode ends, is rewarded and exported in one control call
        (``/rl/finish_session``); False: three (end, set_reward, export)."""
        if collector is not None and reward_fn is not None:
            raise ValueError("a reward function scores an ended episode, and the collector takes a session's export "
                             "as soon as it ends: with a collector, the agent's return value is the reward")
        self.client = client
        self._agent_for: AgentFactory = agent if _is_factory(agent) else (lambda gid, data: agent)
        self.group_size = group_size
        self.episode_timeout = episode_timeout
        self.mode = mode
        self.export_style = export_style
        self.discount = discount
        self.allowance = allowance
        self.reward_fn = reward_fn
        self.reward_range = reward_range
        self.max_consecutive_failures = max_consecutive_failures
        self._stop: TooManyFailures | None = None  # set by the failure that made the streak too long
        self.collector = collector
        self.fused_finish = fused_finish
        self.batch_starts = batch_starts  # set False on the first 404/405 from an older gateway
        self._starts = BatchedStarts(client)
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
        await self._starts.aclose()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # ------------------------------------------------------------------ one episode

    async def _start_session(self, task_id: str) -> Any:
        delay = 0.01
        while True:
            try:
                if self.batch_starts:
                    return await self._starts.start(task_id)
                return await self.client.start_session(task_id)
            except GatewayClientError as exc:
                if exc.route == "/rl/start_sessions" and exc.status in (404, 405):  # an older gateway
                    self.batch_starts = False
                    continue
                if exc.status != 429:
                    raise
                await asyncio.sleep(delay)  # no capacity yet: the trainer grants more per version
                delay = min(delay * 2, 0.5)

    async def _play(self, ep: Episode, session: Any, *, in_group: bool = False) -> None:
        agent = self._agent_for(ep.group_id, ep.data)
        kwargs = dict(base_url=self.client.base_url, api_key=session.api_key, timeout=self.episode_timeout)
        if self.mode == "subprocess":
            ep.output = await run_subprocess(agent, ep.data, **kwargs)
        elif self.mode == "ray":
            ep.output = await self._ray.run(agent, ep.data, **kwargs)
        else:
            ep.output = await run_inline(agent, ep.data, http_client=self.http_client(), **kwargs)
        if self.reward_fn is None:  # check before anything else: a bad return value is a bug to report
            ep.result = check_result(ep.output, self.reward_range)
        if self.collector is not None:
            export = await self._collected(ep, session)
        elif self.reward_fn is None and self.fused_finish:
            export = await self._finished(ep, session)
        else:
            if await session.end() == 0:
                raise AgentError(NO_LLM_CALL)
            if self.reward_fn is not None:
                seen = await session.export(style="individual", keep=True)
                ep.finished = FinishedEpisode(ep.data, ep.output, session.session_id,
                                              [Sample.from_dict(d) for d in seen["interactions"]])
                if in_group and isinstance(self.reward_fn, GroupReward):  # scored with the others: group()
                    ep.awaiting_group = session
                    return
                ep.result = check_result(await score_episode(self.reward_fn, ep.finished), self.reward_range,
                                         source="reward function")
            export = await self._rewarded_export(ep, session)
        self._take(ep, export)

    async def _rewarded_export(self, ep: Episode, session: Any) -> dict[str, Any]:
        await _set_rewards(session, ep.result)  # an ended session: with the admin key
        export: dict[str, Any] = await session.export(style=self.export_style, discount=self.discount)
        return export

    @staticmethod
    def _take(ep: Episode, export: dict[str, Any]) -> None:
        ep.samples = [Sample.from_dict(d) for d in export["interactions"]]
        for s in ep.samples:
            s.group_id, s.episode = ep.group_id, ep.index
        ep.stats = export["stats"]

    async def _finished(self, ep: Episode, session: Any) -> dict[str, Any]:
        """End, reward and export in one call (``/rl/finish_session``). A session without a completed
        interaction is refused before anything changes (400 ``no_completed_interaction``): the agent
        made no LLM call, and the session is discarded as any failed episode's."""
        try:
            export: dict[str, Any] = await session.finish(ep.result, style=self.export_style,
                                                          discount=self.discount)
        except GatewayClientError as exc:
            if exc.status == 400 and _error_code(exc.body) == NOTHING_TO_REWARD:
                raise AgentError(NO_LLM_CALL) from None
            raise
        ep.exported = True
        return export

    async def _collected(self, ep: Episode, session: Any) -> dict[str, Any]:
        """With a collector: rewards first (the collector takes the export the moment the session
        ends), then end, then the export from the collector. Whether the agent made any LLM call
        is read from the export's stats: a session without one has nothing to reward."""
        refused: GatewayClientError | None = None
        try:
            await _set_rewards(session, ep.result)  # still active: with the session key
        except GatewayClientError as exc:  # e.g. nothing to reward; the export below says whether that is why
            refused = exc
        collected = self.collector.expect(session.session_id)
        try:
            await session.end()
            export: dict[str, Any] = await asyncio.wait_for(collected, self.episode_timeout)
        finally:
            collected.cancel()
        ep.exported = True  # nothing left on the gateway to discard
        if export["stats"]["completed"] == 0:
            raise AgentError(NO_LLM_CALL)
        if refused is not None:
            raise refused
        return export

    async def episode(self, group_id: str, index: int, data: dict[str, Any], *, admit: bool = True,
                      in_group: bool = False) -> Episode:
        """Play one episode. ``in_group`` (``group()``): a group-form reward function leaves it ended and
        unrewarded (``awaiting_group``) for the group's scoring."""
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
                await self._play(ep, session, in_group=in_group)
                if ep.awaiting_group is None:
                    self._completed(ep)
            except RunError:  # a bug to report, not an episode to lose
                await self._discard(session, ep)
                raise
            except Exception as exc:  # noqa: BLE001 - a failure loses only this episode (cancellation propagates)
                self._failed(ep, exc)
                await self._discard(session, ep)
            finally:
                ep.seconds = time.perf_counter() - t0
        if self._stop is not None:
            raise self._stop
        return ep

    def _completed(self, ep: Episode) -> None:
        ep.ok = True
        self.counters.completed += 1
        self.counters.consecutive_failures = 0
        self._stop = None  # the streak is broken

    def _failed(self, ep: Episode, exc: BaseException) -> None:
        """Count a failed episode; the first one of the run is logged with its full traceback."""
        if isinstance(exc, (AgentError, GatewayClientError)):
            ep.error = str(exc)
        else:
            ep.error = f"{type(exc).__name__}: {exc}"
        if "timed out" in ep.error:
            self.counters.timed_out += 1
        self.counters.failed += 1
        self.counters.consecutive_failures += 1
        where = f"episode {ep.group_id}/{ep.index}"
        if self.counters.first_failure is None:
            self.counters.first_failure = f"{where}: {ep.error}"
            details = getattr(exc, "details", None)
            if details is None and not isinstance(exc, GatewayClientError):
                details = "".join(traceback.format_exception(exc))
            log.error("%s failed: %s\n%s(the first failed episode of this run; later ones are counted, "
                      "not printed)", where, ep.error, details or "")
        else:
            log.debug("%s failed: %s", where, ep.error)
        limit = self.max_consecutive_failures
        if limit and self.counters.consecutive_failures == limit and self._stop is None:
            # decided here, at the failure that reaches the limit: episodes failing while this one
            # is being discarded do not change what the run reports
            self._stop = TooManyFailures(
                f"{limit} episodes failed in a row (rollout.max_consecutive_failures = {limit}); "
                f"the first failure of this run: {self.counters.first_failure}")

    async def _discard(self, session: Any, ep: Episode) -> None:
        """End and drop a failed episode's session, so its key is retired and memory freed."""
        if session is None or ep.exported:
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
        episodes = await _gather_all_or_none([self.episode(group_id, i, data, admit=admit, in_group=True)
                                              for i in range(self.group_size)])
        await self._score_group([e for e in episodes if e.awaiting_group is not None])
        if self._stop is not None:
            raise self._stop
        return Group(group_id, data, episodes)

    async def _score_group(self, waiting: list[Episode]) -> None:
        """A group-form reward scores the group's played episodes side by side (trajectory/reward.py); each
        is then rewarded and exported. A reward that fails fails them all, as it fails one episode."""
        if not waiting:
            return
        try:
            # (every waiting episode has one: _play sets it before it leaves an episode to its group)
            rewards = await score_group(self.reward_fn, [e.finished for e in waiting if e.finished is not None])
        except RunError:
            await self._release(waiting)
            raise
        except Exception as exc:  # noqa: BLE001 - a failed reward loses these episodes, as in _play
            await self._release(waiting, exc)
            return
        for e, reward in zip(waiting, rewards, strict=True):
            try:
                e.result = check_result(reward, self.reward_range, source="reward function")
                self._take(e, await self._rewarded_export(e, e.awaiting_group))
                self._completed(e)
                e.awaiting_group = None
            except RunError:  # a bug to report: this session and the group's unrewarded ones are discarded
                await self._release(waiting)
                raise
            except Exception as exc:  # noqa: BLE001 - a failure loses only this episode
                await self._release([e], exc)

    async def _release(self, waiting: list[Episode], exc: BaseException | None = None) -> None:
        """Discard the sessions still awaiting their group's reward (``exc``: count them as failed by it)."""
        for e in waiting:
            if e.awaiting_group is not None:
                if exc is not None:
                    self._failed(e, exc)
                await self._discard(e.awaiting_group, e)
                e.awaiting_group = None

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
                # Read every finished task's outcome before yielding or raising: two groups
                # failing in one wait would otherwise leave one exception never retrieved
                # (asyncio logs it with a second traceback).
                failures = [exc for t in done if not t.cancelled() and (exc := t.exception()) is not None]
                if failures:
                    raise failures[0]
                for t in done:
                    yield t.result()
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def evaluate(self, items: list[dict[str, Any]], *, group_id: str = "eval",
                       grant_capacity: bool = True) -> list[Episode]:
        """One episode per item, outside the trainer's allowance (capacity granted here).

        Raises :class:`TooManyFailures` when every episode failed: there is no score to report.
        """
        if not items:
            return []
        if grant_capacity:
            await self.client.grant_capacity(len(items))
        episodes = await _gather_all_or_none([self.episode(f"{group_id}-{i}", 0, d, admit=False)
                                              for i, d in enumerate(items)])
        if not any(e.ok for e in episodes):
            raise TooManyFailures(f"evaluation: all {len(episodes)} episodes failed; "
                                  f"first: {episodes[0].group_id}: {episodes[0].error}")
        return episodes


async def _gather_all_or_none(coros: list[Any]) -> list[Any]:
    """Like ``gather``, but when one raises the others are cancelled (no orphaned episodes)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _set_rewards(session: Any, result: AgentResult | None) -> None:
    if isinstance(result, dict):
        for iid, r in result.items():
            await session.set_reward(r, interaction_id=iid)
    else:
        assert result is not None
        await session.set_reward(result)


def _error_code(body: Any) -> Any:
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def _is_factory(obj: Any) -> bool:
    return callable(obj) and not hasattr(obj, "run")
