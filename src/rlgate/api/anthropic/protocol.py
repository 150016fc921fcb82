"""Anthropic Messages wire models (request side), in the API reference's order.

Content is given as a string or as a list of typed blocks. A string is shorthand for
one ``text`` block; the models turn it into that block while validating, so the
converter only ever sees block lists. Block types rlgate does not convert (``document``,
``search_result``, server-tool blocks...) are refused with a 400 that names the type.

``cache_control`` is accepted on every block and ignored (it is a caching hint for
Anthropic's servers; it does not change what the model sees). Top-level fields rlgate
does not act on are accepted and reported (log + the ``x-rlgate-ignored-params``
response header), never silently dropped. rlgate's own extensions are in a marked
block at the end of :class:`MessageCreateRequest`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _typed_blocks(accepted: tuple[str, ...], where: str):  # noqa: ANN202 - a pydantic validator
    """Validator: a string becomes one text block; unknown block types get a clear error."""

    def check(value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        if not isinstance(value, list):
            raise PydanticCustomError("content_type", "must be a string or a list of content blocks")
        for index, block in enumerate(value):
            if isinstance(block, dict) and isinstance(block.get("type"), str) and block["type"] not in accepted:
                raise PydanticCustomError(
                    "unsupported_block",
                    "block {index}: unsupported content block type '{block_type}' in {where}; "
                    "rlgate accepts: {accepted}",
                    {"index": index, "block_type": block["type"], "where": where, "accepted": ", ".join(accepted)},
                )
        return value

    return check


# --------------------------------------------------------------------------- content blocks


class CacheControlEphemeralParam(_Open):
    type: str = "ephemeral"
    ttl: str | None = None


class TextBlockParam(_Open):
    type: Literal["text"]
    text: str
    cache_control: CacheControlEphemeralParam | None = None
    citations: list[dict[str, Any]] | None = None


class Base64ImageSourceParam(_Open):
    type: Literal["base64"]
    media_type: str
    data: str


class URLImageSourceParam(_Open):
    type: Literal["url"]
    url: str  # kept as a reference; never fetched


ImageSource = Annotated[Base64ImageSourceParam | URLImageSourceParam, Field(discriminator="type")]


class ImageBlockParam(_Open):
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControlEphemeralParam | None = None


class ToolUseBlockParam(_Open):
    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControlEphemeralParam | None = None


TOOL_RESULT_BLOCK_TYPES = ("text", "image")
ToolResultContentBlock = Annotated[TextBlockParam | ImageBlockParam, Field(discriminator="type")]
ToolResultContent = Annotated[
    list[ToolResultContentBlock],
    BeforeValidator(
        _typed_blocks(TOOL_RESULT_BLOCK_TYPES, "tool_result content"),
        json_schema_input_type=str | list[ToolResultContentBlock],
    ),
]


class ToolResultBlockParam(_Open):
    type: Literal["tool_result"]
    tool_use_id: str
    content: ToolResultContent | None = None
    is_error: bool | None = None
    cache_control: CacheControlEphemeralParam | None = None


class ThinkingBlockParam(_Open):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockParam(_Open):
    type: Literal["redacted_thinking"]
    data: str


MESSAGE_BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
ContentBlockParam = Annotated[
    TextBlockParam | ImageBlockParam | ToolUseBlockParam | ToolResultBlockParam | ThinkingBlockParam | RedactedThinkingBlockParam,
    Field(discriminator="type"),
]
MessageContent = Annotated[
    list[ContentBlockParam],
    BeforeValidator(
        _typed_blocks(MESSAGE_BLOCK_TYPES, "a message"),
        json_schema_input_type=str | list[ContentBlockParam],
    ),
]
SystemContent = Annotated[
    list[TextBlockParam],
    BeforeValidator(_typed_blocks(("text",), "system"), json_schema_input_type=str | list[TextBlockParam]),
]


class MessageParam(_Open):
    # "system": a mid-conversation system message (Anthropic's placement rules are checked in
    # serving: right after a user message, then an assistant message or the end; text only).
    role: Literal["user", "assistant", "system"]
    content: MessageContent


# --------------------------------------------------------------------------- tools


class AnthropicToolParam(_Open):
    """A client tool. Server tools (``{"type": "bash_20250124", ...}``) are refused."""

    type: str | None = None  # absent or "custom" for client tools
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # required for client tools (checked in serving)
    cache_control: CacheControlEphemeralParam | None = None
    strict: bool | None = None  # reported when true: the input is not constrained to the schema


class ToolChoiceAutoParam(_Open):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAnyParam(_Open):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceToolParam(_Open):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNoneParam(_Open):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAutoParam | ToolChoiceAnyParam | ToolChoiceToolParam | ToolChoiceNoneParam, Field(discriminator="type")
]


class MetadataParam(_Open):
    user_id: str | None = None


class ThinkingConfigParam(_Open):
    type: str  # "enabled" | "disabled" | "adaptive"
    budget_tokens: int | None = None


# --------------------------------------------------------------------------- requests


class MessageCreateRequest(_Open):
    max_tokens: int = Field(ge=1)  # required, as in Anthropic's API
    messages: list[MessageParam]
    model: str | None = None
    container: Any = None
    mcp_servers: list[dict[str, Any]] | None = None
    metadata: MetadataParam | None = None
    service_tier: str | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    system: SystemContent | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)  # Anthropic's range
    thinking: ThinkingConfigParam | None = None
    tool_choice: ToolChoice | None = None
    tools: list[AnthropicToolParam] | None = None
    top_k: int | None = Field(default=None, ge=0)  # 0: off
    top_p: float | None = Field(default=None, gt=0, le=1)
    # ---- rlgate extensions ----------------------------------------------------
    seed: int | None = None  # per-request sampling seed (same seed + same prompt -> same tokens)
    chat_template_kwargs: dict[str, Any] | None = None  # passed to the chat template


class CountTokensRequest(_Open):
    """``/v1/messages/count_tokens``: the prompt-shaping fields of a create request."""

    messages: list[MessageParam]
    model: str | None = None
    mcp_servers: list[dict[str, Any]] | None = None
    system: SystemContent | None = None
    thinking: ThinkingConfigParam | None = None
    tool_choice: ToolChoice | None = None
    tools: list[AnthropicToolParam] | None = None
    # ---- rlgate extensions ----------------------------------------------------
    chat_template_kwargs: dict[str, Any] | None = None


# Parameters accepted for compatibility but without effect (reported, not silent).
IGNORED_PARAMS = ("container", "mcp_servers", "metadata", "service_tier", "thinking")
# Fields of a create request that count_tokens accepts without complaint: a client may
# send the very same body to both routes.
COUNT_TOKENS_ALSO_ACCEPTS = (
    "max_tokens", "stream", "stop_sequences", "temperature", "top_k", "top_p", "seed", "metadata",
    "service_tier", "container",
)
