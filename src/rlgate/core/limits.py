"""Per-request limits every API surface shares (messages, tools, stop sequences: 400).

Every limit is a :class:`~rlgate.config.GatewayConfig` field; docs/operations.md has the
table of limits, defaults and answers.
"""

from __future__ import annotations

from rlgate.config import GatewayConfig
from rlgate.core.request import ChatRequest
from rlgate.errors import InvalidRequest


def check_request_limits(config: GatewayConfig, req: ChatRequest) -> None:
    """400 when a generation request has more messages, tools or stop sequences than allowed."""
    checks = (
        (len(req.messages), config.max_messages_per_request, "messages", "max_messages_per_request",
         "too_many_messages"),
        (len(req.tools), config.max_tools, "tools", "max_tools", "too_many_tools"),
        (len(req.stop), config.max_stop_sequences, "stop", "max_stop_sequences", "too_many_stop_sequences"),
    )
    for n, limit, param, name, code in checks:
        if n > limit:
            raise InvalidRequest(f"{n} {param} given; at most {limit} allowed ({name})", param=param, code=code)
