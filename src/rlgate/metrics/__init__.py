"""Prometheus metrics and silent-failure guards (per process; nothing of HTTP here).

* :mod:`rlgate.metrics.gateway` — the gateway's registry, counters, histograms and guards;
* :mod:`rlgate.metrics.guards` — the windowed threshold alarm behind every guard;
* :mod:`rlgate.metrics.training` — per-step training metrics (``rlgate train`` / ``demo``).
"""

from __future__ import annotations

from rlgate.metrics.gateway import GatewayMetrics, GenerationOutcome
from rlgate.metrics.guards import Guard, GuardSet, GuardSpec

__all__ = ["GatewayMetrics", "GenerationOutcome", "Guard", "GuardSet", "GuardSpec"]
