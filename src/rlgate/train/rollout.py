"""The rollout runner a run's ``rollout:`` section describes, built in one place.

``rlgate train`` / ``check`` / ``eval`` (``train/run.py``) and the TRL adapters
(``integrations/trl.py``, ``integrations/trl_async.py``) all build their
:class:`~rlgate.rollout.runner.RolloutRunner` here from a
:class:`~rlgate.train.config.RolloutSettings`, so a knob of that section means the same
everywhere and has one default.
"""

from __future__ import annotations

from typing import Any, Literal

from rlgate.rollout.runner import RolloutRunner
from rlgate.train.config import RolloutSettings

__all__ = ["rollout_runner"]


def rollout_runner(settings: RolloutSettings, client: Any, agent: Any, *, reward_fn: Any = None,
                   ray_options: dict[str, Any] | None = None,
                   export_style: Literal["individual", "concat"] | None = None) -> RolloutRunner:
    """A runner playing ``agent`` through ``client`` as ``settings`` say. ``ray_options`` (a run's
    ``ray.episode``) makes each episode a Ray task; ``export_style`` overrides the section's where the
    consumer needs one layout (TRL takes one sequence per episode: ``concat``)."""
    r = settings
    return RolloutRunner(client, agent, group_size=r.group_size, concurrency=r.concurrency,
                         episode_timeout=r.episode_timeout, mode="ray" if ray_options is not None else r.mode,
                         export_style=export_style or r.export_style, discount=r.discount, reward_fn=reward_fn,
                         reward_range=r.reward_range, max_consecutive_failures=r.max_consecutive_failures,
                         ray_options=ray_options, batch_starts=r.batch_starts, fused_finish=r.fused_finish)
