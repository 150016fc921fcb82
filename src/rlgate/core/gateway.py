"""The gateway's state: everything a request handler may touch.

One :class:`Gateway` per app (``app.state.gateway``); there is no module-level mutable
state, so tests build as many isolated gateways as they like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlgate.config import GatewayConfig
from rlgate.core.generation import GenerationService
from rlgate.core.policies import PolicyRegistry
from rlgate.core.sessions import SessionManager
from rlgate.engine.base import Engine
from rlgate.metrics.gateway import GatewayMetrics
from rlgate.store.base import Store


@dataclass
class Gateway:
    """Everything a request handler may touch."""

    config: GatewayConfig
    engine: Engine
    store: Store
    tokenizer: Any
    sessions: SessionManager
    generation: GenerationService
    started_at: float

    @property
    def policies(self) -> PolicyRegistry:
        """The policies served: the default and the adapter policies (core/policies.py)."""
        return self.generation.policies

    @property
    def metrics(self) -> GatewayMetrics:
        """Prometheus registry and silent-failure guards of this gateway."""
        return self.sessions.gateway_metrics
