"""One training step's batch, built the same way by both trainers.

``rlgate train``'s loop (``train/grpo.py``: groups of episodes played by the rollout runner) and the
online trainer (``online/trainer.py``: live groups and rewarded turns of real traffic) differ only in
where their samples come from. What a step is made of is written here once:

* **Staleness** (:func:`lag`): how many weight versions a unit of samples is behind the trainer — the
  trainer's version minus the oldest version that generated a token of it (0 for samples without
  versions). Each trainer drops what lags more than its bound (``grpo.max_staleness``; online,
  ``--max-staleness-versions``), counted.
* **Group ids** (:class:`StepBatch`): each unit's samples enter with the GRPO group id their advantage
  is computed within, and the unit's lag and age.
* **Step metrics** (:meth:`StepBatch.metrics`): samples, groups, the mean reward and the staleness
  (mean and max, in versions; in hours when ages are known) of what the step trains on — the same
  names in ``rlgate train``'s metrics.jsonl and in ``GET /rl/online``'s ``last_step``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rlgate.trajectory.sample import Sample

__all__ = ["StepBatch", "lag"]


def lag(samples: Sequence[Sample], version: int) -> int:
    """Versions between ``version`` (the trainer's) and the oldest that generated a token of ``samples``
    (0 when none has a version)."""
    oldest = [v for v in (s.min_version for s in samples) if v is not None]
    return version - min(oldest) if oldest else 0


@dataclass
class StepBatch:
    """The samples of one step, their group ids, and each unit's lag (and age)."""

    samples: list[Sample] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)  # one per unit added
    ages_hours: list[float] = field(default_factory=list)  # one per unit added with an age

    def add(self, samples: Sequence[Sample], group_ids: str | Sequence[str], *, lag: int,
            age_hours: float | None = None) -> None:
        """A unit of samples (a group, a rewarded turn): all under one group id, or one id per sample."""
        ids = [group_ids] * len(samples) if isinstance(group_ids, str) else list(group_ids)
        if len(ids) != len(samples):
            raise ValueError(f"{len(ids)} group ids for {len(samples)} samples")
        self.samples += samples
        self.group_ids += ids
        self.lags.append(lag)
        if age_hours is not None:
            self.ages_hours.append(age_hours)

    def metrics(self) -> dict[str, float]:
        rewards = [s.reward for s in self.samples if s.reward is not None]
        out = {"samples": float(len(self.samples)), "groups": float(len(set(self.group_ids))),
               "reward_mean": sum(rewards) / max(len(rewards), 1),
               "staleness_versions_mean": sum(self.lags) / max(len(self.lags), 1),
               "staleness_versions_max": float(max(self.lags, default=0))}
        if self.ages_hours:
            out["staleness_hours_mean"] = sum(self.ages_hours) / len(self.ages_hours)
            out["staleness_hours_max"] = max(self.ages_hours)
        return out
