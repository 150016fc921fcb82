"""OpenAI Responses API wire models (request side), in the API reference's order.

``input`` is a string or a list of items. Items are told apart by ``type``; a
message may leave ``type`` out (``{"role": ..., "content": ...}``, the "easy input
message" form). Item and content-part types rlgate cannot serve (``item_reference``,
``web_search_call``, ``input_file``, ``input_audio``, ...) fail validation with a
400 naming the type, before anything is generated.

Fields rlgate does not act on are accepted and reported (log + the
``x-rlgate-ignored-params`` response header), never silently dropped; so are tools of
types rlgate cannot serve (hosted tools: ``web_search``, ``file_search``...). A few that
would change the meaning of the request in ways rlgate cannot honour (``background``,
``conversation``, ``prompt``) are refused with a 400. rlgate's own extensions are in a
marked block at the end of :class:`ResponseCreateRequest`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticCustomError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _str_or_list(value: Any) -> str | None:
    return "str" if isinstance(value, str) else ("list" if isinstance(value, list) else None)


def _text_or(parts: Any, what: str) -> Any:
    """``str | list[parts]``, validated by the input's kind only (one clear error, not one per branch)."""
    return Annotated[
        Annotated[str, Tag("str")] | Annotated[list[parts], Tag("list")],
        Discriminator(_str_or_list, custom_error_type="string_or_list",
                      custom_error_message=f"must be a string or a list of {what}"),
    ]


def _tag(value: Any) -> str | None:
    """Discriminator: the item's ``type``; a typeless item with a ``role`` is a message."""
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is None and "role" in value:
            return "message"
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


# --------------------------------------------------------------------------- content parts


class InputTextPart(_Open):
    type: Literal["input_text"]
    text: str


class OutputTextPart(_Open):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None


class InputImagePart(_Open):
    type: Literal["input_image"]
    image_url: str | None = None  # a data: URL or a URL (kept as a reference, never fetched)
    file_id: str | None = None  # not supported (no file storage): 400
    detail: str | None = None


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


MessageContentPart = Annotated[
    Annotated[InputTextPart, Tag("input_text")]
    | Annotated[OutputTextPart, Tag("output_text")]
    | Annotated[InputImagePart, Tag("input_image")]
    | Annotated[RefusalPart, Tag("refusal")],
    Discriminator(_tag),
]

FunctionOutputPart = Annotated[
    Annotated[InputTextPart, Tag("input_text")]
    | Annotated[InputImagePart, Tag("input_image")],
    Discriminator(_tag),
]


# --------------------------------------------------------------------------- input items


class MessageItem(_Open):
    """A message (``EasyInputMessage``, input ``Message`` or an echoed output message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: _text_or(MessageContentPart, "content parts")  # type: ignore[valid-type]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Open):
    """A call the model made (echoed back by the client)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    namespace: str | None = None  # the namespace tool the function belongs to
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Open):
    """The result of a call, tied to it by ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: _text_or(FunctionOutputPart, "content parts")  # type: ignore[valid-type]
    id: str | None = None
    status: str | None = None


class CustomToolCallItem(_Open):
    """A call of a custom (free-form input) tool, echoed back."""

    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputItem(_Open):
    type: Literal["custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: _text_or(FunctionOutputPart, "content parts")  # type: ignore[valid-type]
    id: str | None = None


class LocalShellCallItem(_Open):
    """A ``local_shell`` call, echoed back; ``action`` is ``{"type": "exec", "command": [...], ...}``."""

    type: Literal["local_shell_call"]
    call_id: str = Field(min_length=1)
    action: dict[str, Any]
    id: str | None = None
    status: str | None = None


class LocalShellCallOutputItem(_Open):
    """The output of a ``local_shell`` call; ``id`` names the call (its call_id)."""

    type: Literal["local_shell_call_output"]
    id: str = Field(min_length=1)
    output: str
    status: str | None = None


class ReasoningSummary(_Open):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningContent(_Open):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(_Open):
    """Reasoning of the next assistant turn (``content`` text if any, else the summary)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningSummary] = Field(default_factory=list)
    content: list[ReasoningContent] | None = None
    encrypted_content: str | None = None  # never produced by rlgate; ignored
    status: str | None = None


class ItemReference(_Open):
    """An item of an earlier response of this session, named by its id (``rs_…``, ``msg_…``, ``fc_…``):
    the Vercel AI SDK's ``openai()`` provider sends one for each reasoning item it received."""

    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=256)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[LocalShellCallItem, Tag("local_shell_call")]
    | Annotated[LocalShellCallOutputItem, Tag("local_shell_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_tag),
]
ITEM_TYPES = ("message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
              "local_shell_call", "local_shell_call_output", "reasoning", "item_reference")
_PART_TAGS = {"input_text", "output_text", "input_image", "refusal"}
_ITEM = TypeAdapter(InputItem)


def _where(loc: tuple[Any, ...]) -> str:
    """A pydantic error location inside one item, without the union tags pydantic puts in it."""
    out = ""
    for k, p in enumerate(loc):
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("str", "list") or (k == 0 and p in ITEM_TYPES) or (
                k and isinstance(loc[k - 1], int) and p in _PART_TAGS):
            continue
        else:
            out += f".{p}"
    return out


def validate_items(items: Any) -> Any:
    """``input`` list -> items, with one error naming the item and what is wrong with it."""
    if not isinstance(items, list):
        return items
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise PydanticCustomError("invalid_item", f"input[{i}] must be an object (an input item)")
        kind = _tag(item)
        if kind is None:
            raise PydanticCustomError(
                "invalid_item", f"input[{i}] needs a 'type' ({', '.join(ITEM_TYPES)}) or a 'role' (a message)")
        if kind not in ITEM_TYPES:
            raise PydanticCustomError(
                "invalid_item",
                f"input[{i}]: input item type {kind!r} is not supported by rlgate (supported: "
                f"{', '.join(ITEM_TYPES)})")
        try:
            out.append(_ITEM.validate_python(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise PydanticCustomError("invalid_item", f"input[{i}]{_where(err['loc'])}: {err['msg']}") from None
    return out


# --------------------------------------------------------------------------- tools


class FunctionToolParam(_Open):
    """A function tool, in the Responses API's flat shape."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomToolParam(_Open):
    """A tool whose input is free text (optionally described by a grammar), not JSON."""

    type: Literal["custom"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    format: dict[str, Any] | None = None  # {"type": "text"} | {"type": "grammar", "syntax", "definition"}


NamespaceMember = Annotated[
    Annotated[FunctionToolParam, Tag("function")] | Annotated[CustomToolParam, Tag("custom")],
    Discriminator(_tag, custom_error_type="unsupported_tool",
                  custom_error_message="a namespace holds function and custom tools only"),
]


class NamespaceToolParam(_Open):
    """Function / custom tools grouped under a name; calls name the namespace."""

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    tools: list[NamespaceMember]


class LocalShellToolParam(_Open):
    """The model runs shell commands through the client (``local_shell_call`` items)."""

    type: Literal["local_shell"]


class OtherToolParam(_Open):
    """A tool rlgate cannot serve (hosted tools such as ``web_search``, ``file_search``,
    ``code_interpreter``, ``mcp``...): accepted, not shown to the model, reported."""

    type: str


SERVED_TOOL_TYPES = ("function", "custom", "namespace", "local_shell")


def _tool_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return None
    return kind if kind in SERVED_TOOL_TYPES else "other"


ToolParam = Annotated[
    Annotated[FunctionToolParam, Tag("function")]
    | Annotated[CustomToolParam, Tag("custom")]
    | Annotated[NamespaceToolParam, Tag("namespace")]
    | Annotated[LocalShellToolParam, Tag("local_shell")]
    | Annotated[OtherToolParam, Tag("other")],
    Discriminator(_tool_tag, custom_error_type="invalid_tool", custom_error_message="a tool needs a 'type'"),
]


class ReasoningParam(_Open):
    effort: str | None = None
    summary: str | None = None


class TextConfigParam(_Open):
    format: dict[str, Any] | None = None  # {"type": "text"} is what rlgate produces
    verbosity: str | None = None


# --------------------------------------------------------------------------- request


class ResponseCreateRequest(_Open):
    background: bool | None = None  # true: 400 (no background jobs)
    conversation: Any | None = None  # 400 when set (no conversation objects)
    include: list[str] | None = None
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: Any | None = None  # 400 when set (no stored prompt templates)
    prompt_cache_key: str | None = None
    reasoning: ReasoningParam | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0)
    text: TextConfigParam | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[ToolParam] | None = None
    top_logprobs: int | None = None
    top_p: float | None = Field(default=None, gt=0, le=1)
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    # ---- rlgate extensions ----------------------------------------------------
    top_k: int | None = Field(default=None, ge=-1)  # 0 / -1: off
    seed: int | None = None  # per-request sampling seed
    max_total_tokens: int | None = Field(default=None, ge=1)  # prompt + generated cap
    chat_template_kwargs: dict[str, Any] | None = None  # passed to the chat template

    @field_validator("input", mode="before")
    @classmethod
    def _input_items(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, (str, list)):
            raise PydanticCustomError("invalid_input", "input must be a string or a list of input items")
        return validate_items(value)



# Parameters accepted for compatibility but without effect (reported, not silent).
IGNORED_PARAMS = (
    "max_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "stream_options",
    "top_logprobs",
    "user",
)

# Parameters rlgate cannot honour: a 400 when set.
REFUSED_PARAMS = {
    "conversation": "conversation objects are not supported; send the conversation as input items "
                    "or use previous_response_id",
    "prompt": "stored prompt templates are not supported; send instructions and input instead",
}
