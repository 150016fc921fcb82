"""HTTP client for the gateway's control routes."""

from __future__ import annotations

from rlgate.client.gateway import GatewayClient, GatewayClientError, SessionHandle

__all__ = ["GatewayClient", "GatewayClientError", "SessionHandle"]
