"""``mode: ray``: each episode's agent runs as a Ray task, anywhere in the cluster.

The task gets the gateway (router) URL and its session key, with ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` set in its environment as
in ``subprocess`` mode, runs ``agent.run`` (a coroutine or a plain function) and returns the
value of ``run`` (unchecked: the runner checks it, or a reward function scores the episode).
It asks Ray for ``ray_options`` (e.g. ``{"num_cpus": 1}`` for a sandbox CPU,
``{"resources": {"sandbox": 1}}`` to land on sandbox nodes); the runner keeps rewards,
``end_session`` and the export on its side.

A task that outlives the episode timeout is cancelled with ``force=True``: Ray kills its
worker process, so a hung agent (a stuck sandbox, a blocking call) frees its slot. Tasks are
never retried (``max_retries=0``): a re-run would replay a conversation into a session that
already holds part of it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any

from rlgate.rollout.errors import AgentError

DEFAULT_RAY_OPTIONS: dict[str, Any] = {"num_cpus": 1}


def _episode_task(agent: Any, data: dict[str, Any], base_url: str, api_key: str) -> Any:
    """Runs inside a Ray worker."""
    os.environ.update({
        "OPENAI_BASE_URL": base_url.rstrip("/") + "/v1",
        "OPENAI_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
    })
    out = agent.run(data, base_url=base_url, api_key=api_key)
    if inspect.isawaitable(out):
        out = asyncio.run(_await(out))
    return out


async def _await(aw: Any) -> Any:
    return await aw


class RayEpisodes:
    """Submits episodes as Ray tasks with one resource request (the runner holds one of these)."""

    def __init__(self, ray_options: dict[str, Any] | None = None) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("mode 'ray' needs Ray: call rlgate.cluster.launch.init_ray(...) or ray.init() first")
        options = {**DEFAULT_RAY_OPTIONS, **(ray_options or {}), "max_retries": 0}
        self._ray = ray
        self._task = ray.remote(_episode_task).options(**options)

    async def run(self, agent: Any, data: dict[str, Any], *, base_url: str, api_key: str,
                  timeout: float) -> Any:
        """What the agent's ``run`` returned (unchecked); AgentError if it raised, timed out or died."""
        ref = self._task.remote(agent, data, base_url, api_key)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except TimeoutError as exc:
            self._ray.cancel(ref, force=True)  # kills the worker process
            raise AgentError(f"agent timed out after {timeout:.0f} s (Ray worker killed)") from exc
        except asyncio.CancelledError:
            self._ray.cancel(ref, force=True)
            raise
        except AgentError:
            raise
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, AgentError):
                raise AgentError(str(cause)) from exc
            raise AgentError(f"agent raised {type(cause).__name__}: {cause}") from exc
