"""Per-step training metrics as Prometheus gauges (``rlgate train`` / ``rlgate demo``).

Each numeric value of a step's metrics dict (reward, loss, kl, rollout seconds, ...) becomes
the gauge ``rlgate_train_<name>`` holding the last step's value; ``rlgate_train_step`` is the
last finished step and ``rlgate_train_steps_total`` counts them. The registry is per run; the
trainer serves it on its own port or pushes it to a Pushgateway (train/telemetry.py), so the
same Prometheus / Grafana that scrapes the gateway sees the run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

HELP = {
    "reward": "mean reward of the step's episodes",
    "loss": "GRPO loss of the step",
    "kl_ref": "KL to the reference policy",
    "approx_kl": "approximate KL between the behaviour and the updated policy",
    "clip_fraction": "fraction of tokens whose ratio was clipped",
    "grad_norm": "gradient norm before clipping",
    "rollout_s": "seconds spent waiting for rollouts",
    "train_s": "seconds spent in the optimiser step",
    "sync_s": "seconds spent pushing weights to the engine",
    "episodes": "episodes used by the step",
    "failed_episodes": "episodes that failed during the step",
    "generated_tokens": "tokens generated for the step's episodes",
    "tokens_per_s": "tokens generated for the step's episodes per second of the step's wall time",
    "stale_samples": "samples older than max_staleness, dropped",
    "eval_accuracy": "held-out accuracy at the last evaluation",
    "eval_reward": "mean reward at the last evaluation",
}


def metric_name(key: str) -> str:
    """``rlgate_train_<key>`` with anything but [a-zA-Z0-9_] made ``_``."""
    return "rlgate_train_" + re.sub(r"[^a-zA-Z0-9_]", "_", key).strip("_").lower()


class TrainingMetrics:
    """The registry of one training run."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.step = Gauge("rlgate_train_step", "last finished training step", registry=self.registry)
        self.steps = Counter("rlgate_train_steps", "training steps finished by this process", registry=self.registry)
        self.version = Gauge("rlgate_train_weight_version", "weight version the engine serves after the step",
                             registry=self.registry)
        self._gauges: dict[str, Gauge] = {}

    def record_step(self, step: int, values: Mapping[str, object], version: int | None = None) -> None:
        self.step.set(step)
        self.steps.inc()
        if version is not None:
            self.version.set(version)
        for key, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            name = metric_name(key)
            if name in ("rlgate_train_step", "rlgate_train_steps", "rlgate_train_weight_version"):
                continue
            g = self._gauges.get(name)
            if g is None:
                g = self._gauges[name] = Gauge(name, HELP.get(key, f"per-step value of {key!r}"),
                                               registry=self.registry)
            g.set(float(v))
