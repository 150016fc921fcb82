"""The agent contract and the two ways of running an agent.

An agent is any object with::

    async def run(self, data: dict, *, base_url: str, api_key: str, http_client=None)
        -> float | dict[str, float]

It talks to the gateway with the OpenAI or Anthropic SDK (``base_url`` is the gateway
root: the Anthropic SDK appends ``/v1/messages``, the OpenAI SDK ``/chat/completions``,
both of which rlgate serves), and returns either the reward of the session's last
interaction or ``{interaction_id: reward}``.

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
import multiprocessing as mp
import os
import traceback
from typing import Any, Protocol, runtime_checkable

AgentResult = float | dict[str, float]


@runtime_checkable
class Agent(Protocol):
    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> AgentResult:
        ...


class AgentError(Exception):
    """The agent raised, returned something invalid, or timed out."""


def check_result(result: Any) -> AgentResult:
    if isinstance(result, bool) or not isinstance(result, (int, float, dict)):
        raise AgentError(f"agent returned {type(result).__name__}; expected a float or {{interaction_id: reward}}")
    if isinstance(result, dict):
        try:
            return {str(k): float(v) for k, v in result.items()}
        except (TypeError, ValueError) as exc:
            raise AgentError(f"agent returned a dict with a non-numeric reward: {exc}") from exc
    return float(result)


async def run_inline(agent: Any, data: dict[str, Any], *, base_url: str, api_key: str, timeout: float,
                     http_client: Any = None) -> AgentResult:
    try:
        out = agent.run(data, base_url=base_url, api_key=api_key, http_client=http_client)
        if inspect.isawaitable(out):
            out = await asyncio.wait_for(out, timeout)
        return check_result(out)
    except TimeoutError as exc:
        raise AgentError(f"agent timed out after {timeout:.0f} s") from exc
    except AgentError:
        raise
    except Exception as exc:  # noqa: BLE001 - any agent failure loses only its own episode
        raise AgentError(f"agent raised {type(exc).__name__}: {exc}") from exc


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
        conn.send(("ok", check_result(out)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"))
    finally:
        conn.close()


async def _await(aw: Any) -> Any:
    return await aw


async def run_subprocess(agent: Any, data: dict[str, Any], *, base_url: str, api_key: str,
                         timeout: float) -> AgentResult:
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
            raise AgentError(f"agent raised {value}")
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
