"""Counts every HTTP answer by surface, status and streamed (``rlgate_requests_total``).

The outermost middleware, so it sees the status that really went out (413 from the body
limit, 503 from the durability barrier, 500 from a crash). The surface is read from the
path; paths rlgate does not serve count as ``other`` so labels stay bounded.
"""

from __future__ import annotations

from typing import Any

from rlgate.metrics.gateway import GatewayMetrics

_SURFACES = (
    ("/v1/chat/completions", "chat"), ("/chat/completions", "chat"),
    ("/v1/responses", "responses"), ("/responses", "responses"),
    ("/v1/messages", "messages"),
    ("/rl/", "control"), ("/export_trajectories", "control"), ("/grant_capacity", "control"),
    ("/health", "control"), ("/v1/models", "control"), ("/models", "control"),
    ("/metrics", "metrics"), ("/ui", "ui"),
)


def surface_for_path(path: str) -> str:
    for prefix, surface in _SURFACES:
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            return surface
    return "other"


class RequestMetricsMiddleware:
    def __init__(self, app: Any, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        streamed = False

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal status, streamed
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"content-type":
                        streamed = value.startswith(b"text/event-stream")
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            # status 0 (label "none"): nothing was sent (the client went away first)
            self.metrics.record_request(surface_for_path(scope.get("path", "")), status, streamed)
