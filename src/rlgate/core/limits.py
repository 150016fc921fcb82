"""Per-request limits every API surface shares.

Every limit is a :class:`~rlgate.config.GatewayConfig` field; docs/operations.md has the
table of limits, defaults and answers.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlgate.chat.conversation import ImagePart, Message, TextPart
from rlgate.config import GatewayConfig
from rlgate.core.request import ChatRequest
from rlgate.errors import InvalidRequest, PayloadTooLarge


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


def check_template_kwargs(config: GatewayConfig, req: ChatRequest, reserved: frozenset[str]) -> None:
    """400 for template kwargs that would replace the operator's template or the renderer's own
    arguments (``chat_template``, ``tokenize``, ``messages``, special tokens...), unless the
    operator set ``allow_template_override``."""
    if config.allow_template_override:
        return
    bad = sorted(k for k in req.template_kwargs if k in reserved)
    if bad:
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(repr(k) for k in bad[:8])}: the chat template and "
            "the renderer's arguments are the operator's (allow_template_override)",
            param=f"chat_template_kwargs.{bad[0]}", code="reserved_template_kwarg",
        )


def images(messages: list[Message]) -> Iterator[ImagePart]:
    for m in messages:
        for p in m.content:
            if isinstance(p, ImagePart):
                yield p


def image_size(part: ImagePart) -> int:
    """What an image costs in memory and in the store: its base64 data or its URL."""
    return len(part.data or "") + len(part.url or "") + len(part.media_type or "")


def check_images(config: GatewayConfig, req: ChatRequest) -> None:
    """413 for an image larger than ``max_image_bytes``."""
    for part in images(req.messages):
        size = image_size(part)
        if size > config.max_image_bytes:
            raise PayloadTooLarge(
                f"an image of {size} bytes; at most {config.max_image_bytes} allowed per image (max_image_bytes)",
                param="messages", code="image_too_large",
            )


def request_chars(req: ChatRequest) -> int:
    """Characters of message text and tool-call arguments: every one of them reaches the
    rendered prompt with the templates rlgate serves, so the prompt has at least this many."""
    n = 0
    for m in req.messages:
        for p in m.content:
            if isinstance(p, TextPart):
                n += len(p.text)
        for tc in m.tool_calls:
            n += len(tc.arguments)
    return n
