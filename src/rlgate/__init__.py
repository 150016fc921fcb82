"""rlgate: the RL gateway for LLM agents.

Public surface (everything else is internal and may change)::

    GatewayClient, SessionHandle, GatewayClientError   control-route client
    GatewayConfig                                       server configuration
    create_app                                          the app factory
"""

from __future__ import annotations

from rlgate.client.gateway import GatewayClient, GatewayClientError, SessionHandle
from rlgate.config import GatewayConfig

__version__ = "0.1.0"


def create_app(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - re-exported lazily (pulls FastAPI)
    from rlgate.server.app import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["GatewayClient", "GatewayClientError", "GatewayConfig", "SessionHandle", "create_app", "__version__"]
