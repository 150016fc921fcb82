"""OpenAI Chat Completions wire models (request side), in the API reference's order.

Fields rlgate does not act on are accepted and reported (log + the
``x-rlgate-ignored-params`` response header), never silently dropped. rlgate's own
extensions are in a marked block at the end of :class:`ChatCompletionRequest`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ImageURL(_Open):
    url: str
    detail: str | None = None


class TextContentPart(_Open):
    type: Literal["text"]
    text: str


class ImageContentPart(_Open):
    type: Literal["image_url"]
    image_url: ImageURL


# Tagged by ``type``: a part of another type is refused naming its type and the ones known.
ContentPart = Annotated[TextContentPart | ImageContentPart, Field(discriminator="type")]


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCallParam(_Open):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageParam(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    # rlgate extension: reasoning echoed back by clients (vLLM / DeepSeek style)
    reasoning_content: str | None = None


class FunctionDefinition(_Open):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatCompletionRequest(_Open):
    messages: list[ChatMessageParam]
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, Any] | None = None
    n: int | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, Any] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    store: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0)
    tool_choice: str | dict[str, Any] | None = None
    tools: list[ToolParam] | None = None
    top_p: float | None = Field(default=None, gt=0, le=1)
    user: str | None = None
    # ---- rlgate extensions ----------------------------------------------------
    top_k: int | None = Field(default=None, ge=-1)  # 0 / -1: off
    max_total_tokens: int | None = Field(default=None, ge=1)  # prompt + generated cap
    chat_template_kwargs: dict[str, Any] | None = None  # passed to the chat template


# Parameters accepted for compatibility but without effect (reported, not silent).
IGNORED_PARAMS = (
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "parallel_tool_calls",
    "reasoning_effort",
    "response_format",
    "user",
    "metadata",
)
