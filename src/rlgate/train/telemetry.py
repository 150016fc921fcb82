"""Training metrics out to Prometheus: served on a port, pushed to a Pushgateway, or both.

``rlgate train`` (``metrics:`` in the config) and ``rlgate demo`` (``--metrics-port``,
``--pushgateway``) create one :class:`StepExporter`. With an in-process gateway its registry
is served on the same port, so one scrape sees the run and the gateway's guards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, push_to_gateway

from rlgate.metrics.training import TrainingMetrics
from rlgate.server.metrics_http import MetricsServer
from rlgate.train.config import MetricsSettings

log = logging.getLogger("rlgate.train")

__all__ = ["MetricsSettings", "StepExporter"]


class StepExporter:
    def __init__(self, settings: MetricsSettings, *, extra_registries: tuple[Any, ...] = ()) -> None:
        self.settings = settings
        self.metrics = TrainingMetrics()
        self.served = CollectorRegistry()  # the run's metrics + e.g. an in-process gateway's
        for r in (self.metrics.registry, *extra_registries):
            self.served.register(r)
        self.server = MetricsServer(self.served, settings.host, settings.port) if settings.port is not None else None
        self._push_failed = False

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    async def step(self, step: int, values: Mapping[str, object], version: int | None = None) -> None:
        self.metrics.record_step(step, values, version)
        if self.settings.pushgateway:
            try:  # a blocking HTTP PUT: off the event loop
                await asyncio.to_thread(push_to_gateway, self.settings.pushgateway, job=self.settings.job,
                                        registry=self.metrics.registry)
                self._push_failed = False
            except OSError as exc:  # training goes on; say so once per outage
                if not self._push_failed:
                    log.warning("pushgateway %s: push failed (%s); will keep trying every step",
                                self.settings.pushgateway, exc)
                self._push_failed = True

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
