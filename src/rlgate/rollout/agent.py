"""The agent contract and the two ways of running an agent.

An agent is any object with::

    async def run(self, data: dict, *, base_url: str, api_key: str, http_client=None)
        -> float | dict[str, float]

It talks to the gateway with the OpenAI or Anthropic SDK (``base_url`` is the gateway
root: the Anthropic SDK appends ``/v1/messages``, the OpenAI SDK ``/chat/completions``,
both of which rlgate serves), and returns either the reward of the session's last
interaction or ``{interaction_id: reward}``. Rewards must be finite numbers; anything
else (``None``, a string, ``True``, NaN) is a bug in the agent and stops the run
(:class:`~rlgate.rollout.errors.AgentContractError`). ``http_client`` may be left out of
the signature (it is then not passed). With a reward function (``reward: module:fn`` in
``rlgate train``), ``run`` may return anything: the reward function scores the episode.

Modes:

* ``inline``: the coroutine runs in the runner's event loop.
* ``subprocess``: each episode runs in its own process (``spawn``), with
  ``OPENAI_BASE_URL`` (root + ``/v1``), ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL`` and
  ``ANTHROPIC_API_KEY`` set in the child's environment, so SDK clients built without
  arguments reach the gateway. ``run`` may be a plain (blocking) function there. The agent
  object must be picklable (its class importable). A child that outlives its timeout is
  killed. Process start-up costs ~0.5–1 s per episode; use it for agents that block,
  leak or crash, not for throughput.
* ``ray``: each episode runs as a Ray task anywhere in the cluster, with the same
  environment as ``subprocess`` and its own resource request (``rollout/ray_mode.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import multiprocessing as mp
import os
import traceback
from typing import Any, Protocol, runtime_checkable

from rlgate.rollout.errors import AgentContractError, AgentError

AgentResult = float | dict[str, float]
CONTRACT = "run(self, data, *, base_url, api_key, http_client=None) -> float | {interaction_id: reward}"


@runtime_checkable
class Agent(Protocol):
    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> AgentResult:
        ...


def validate_agent(agent: Any, name: str = "agent") -> None:
    """Raise :class:`AgentContractError` (naming ``name``) unless ``agent.run`` can be called as the contract says."""
    run = getattr(agent, "run", None)
    if run is None or not callable(run):
        raise AgentContractError(f"{name} is not an agent: {type(agent).__name__} has no run() method; "
                                 f"an agent needs {CONTRACT}")
    try:
        sig = inspect.signature(run)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        sig.bind({}, base_url="http://gateway", api_key="key")
    except TypeError as exc:
        raise AgentContractError(f"{name}: {type(agent).__name__}.run{sig} cannot be called as "
                                 f"run(data, base_url=..., api_key=...) ({exc}); an agent needs {CONTRACT}") from None


def accepts_http_client(agent: Any) -> bool:
    try:
        params = inspect.signature(agent.run).parameters
    except (TypeError, ValueError):
        return True
    return "http_client" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_result(result: Any, reward_range: tuple[float, float] | None = None, *, source: str = "agent") -> AgentResult:
    """The reward(s) ``source`` returned, as floats; :class:`AgentContractError` if they are not finite numbers
    (or outside ``reward_range``)."""
    if isinstance(result, bool) or not isinstance(result, (int, float, dict)):
        raise AgentContractError(f"{source} returned {result!r} ({type(result).__name__}); "
                                 f"expected a finite float or {{interaction_id: reward}}")
    values: dict[str, float] = {}
    if isinstance(result, dict):
        for k, v in result.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise AgentContractError(f"{source} returned a dict with reward {v!r} for {k!r}; "
                                         "rewards must be finite floats")
            values[str(k)] = float(v)
    else:
        values[""] = float(result)
    for k, v in values.items():
        where = f" for {k!r}" if k else ""
        if not math.isfinite(v):
            raise AgentContractError(f"{source} returned a non-finite reward {v}{where}; rewards must be finite floats")
        if reward_range is not None and not reward_range[0] <= v <= reward_range[1]:
            raise AgentContractError(f"{source} returned reward {v}{where}, outside reward_range "
                                     f"[{reward_range[0]}, {reward_range[1]}]")
    return values if isinstance(result, dict) else values[""]


def _details(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


async def run_inline(agent: Any, data: dict[str, Any], *, base_url: str, api_key: str, timeout: float,
                     http_client: Any = None) -> Any:
    """Run one episode in this event loop; returns what ``run`` returned (unchecked)."""
    try:
        kwargs: dict[str, Any] = {"base_url": base_url, "api_key": api_key}
        if accepts_http_client(agent):
            kwargs["http_client"] = http_client
        out = agent.run(data, **kwargs)
        if inspect.isawaitable(out):
            out = await asyncio.wait_for(out, timeout)
        return out
    except TimeoutError as exc:
        raise AgentError(f"agent timed out after {timeout:.0f} s (rollout.episode_timeout)") from exc
    except (AgentError, AgentContractError):
        raise
    except Exception as exc:  # noqa: BLE001 - any agent failure loses only its own episode
        raise AgentError(f"agent raised {type(exc).__name__}: {exc}", details=_details(exc)) from exc


def _child(agent: Any, data: dict[str, Any], base_url: str, api_key: str, conn: Any) -> None:
    os.environ.update({
        "OPENAI_BASE_URL": base_url.rstrip("/") + "/v1",
        "OPENAI_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
    })
    try:
        out = agent.run(data, base_url=base_url, api_key=api_key)
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
        conn.send(("ok", out))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", (f"{type(exc).__name__}: {exc}", _details(exc))))
    finally:
        conn.close()


async def _await(aw: Any) -> Any:
    return await aw


async def run_subprocess(agent: Any, data: dict[str, Any], *, base_url: str, api_key: str,
                         timeout: float) -> Any:
    """Run one episode in a fresh process; returns what ``run`` returned (unchecked)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(agent, data, base_url, api_key, child), daemon=True)
    proc.start()
    child.close()
    loop = asyncio.get_running_loop()
    # Wait on the pipe in the event loop (no thread per waiting episode): it becomes
    # readable when the child sends its result, or at EOF when the child dies.
    readable = loop.create_future()
    fd = parent.fileno()
    
    def on_readable() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        try:
            await asyncio.wait_for(readable, timeout)
        except TimeoutError as exc:
            raise AgentError(f"agent timed out after {timeout:.0f} s (subprocess killed)") from exc
        finally:
            loop.remove_reader(fd)
        try:
            status, value = parent.recv()
        except EOFError as exc:
            proc.join(1)
            raise AgentError(f"agent process died (exit code {proc.exitcode})") from exc
        if status != "ok":
            message, details = value
            raise AgentError(f"agent raised {message}", details=details)
        return value
    finally:
        if proc.is_alive():
            proc.kill()
        for _ in range(500):  # reap without blocking the loop (at most ~5 s)
            if not proc.is_alive():
                break
            await asyncio.sleep(0.01)
        proc.join(0)
        parent.close()
