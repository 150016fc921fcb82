"""One request normalisation step for every surface.

A surface parses its wire body (pydantic), converts its messages and tools to rlgate's
conversation model, reads its own ``tool_choice`` shape, and calls :func:`chat_request`,
which checks what every surface must check the same way and fills in what the request
left out from :class:`~rlgate.core.request.ChatRequest`'s defaults:

* at least one message (besides a system prompt given apart: Anthropic's ``system``);
* tool names are unique (a call names its tool: two of one name cannot be told apart);
* ``tool_choice``: absent means ``"auto"`` with tools and ``"none"`` without;
  ``"required"`` needs tools; a named tool must be one of the tools;
* sampling (``temperature``, ``top_p``, ``top_k``, ``seed``), ``stop``, ``store`` and the
  template arguments: the request's value, else the default.

OpenAI's two ``tool_choice`` shapes (Chat's ``{"type": "function", "function": {"name"}}``
and Responses' ``{"type": "function", "name"}``) are read by :func:`openai_tool_choice`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlgate.chat.conversation import Message, ToolSpec
from rlgate.core.request import ChatRequest, NamedTool, ToolChoice
from rlgate.errors import InvalidRequest

__all__ = ["Sampling", "chat_request", "openai_tool_choice"]

_MODES: dict[str, ToolChoice] = {"auto": "auto", "none": "none", "required": "required"}

@dataclass
class Sampling:
    """What a request says about sampling and recording; None: not given."""

    max_tokens: int | None = None
    max_total_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    store: bool | None = None


def chat_request(
    messages: list[Message],
    tools: list[ToolSpec],
    tool_choice: ToolChoice | None,
    sampling: Sampling,
    *,
    system: Message | None = None,
    template_kwargs: dict[str, Any] | None = None,
    messages_param: str = "messages",
    tool_choice_param: str = "tool_choice",
    tool_name_param: str = "tools[{i}].name",
) -> ChatRequest:
    """The internal request (see the module docstring): ``system`` (a system prompt given apart
    from the messages) goes first; ``*_param`` name the request's fields in errors
    (``tool_name_param`` with ``{i}`` for the tool's index)."""
    if not messages:
        raise InvalidRequest(f"{messages_param} must contain at least one message", param=messages_param)
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if t.name in seen:
            raise InvalidRequest(f"tool names must be unique; {t.name!r} is given twice",
                                 param=tool_name_param.format(i=i))
        seen.add(t.name)
    given = {k: v for k, v in vars(sampling).items() if v is not None}
    return ChatRequest(
        messages=[system, *messages] if system is not None else messages,
        tools=tools,
        tool_choice=_check_tool_choice(tool_choice, tools, tool_choice_param),
        template_kwargs=dict(template_kwargs or {}),
        **given,
    )


def _check_tool_choice(choice: ToolChoice | None, tools: list[ToolSpec], param: str) -> ToolChoice:
    if choice is None:
        return "auto" if tools else "none"
    if choice == "required" and not tools:
        raise InvalidRequest("a tool_choice that requires a tool call needs tools", param=param)
    if isinstance(choice, NamedTool) and choice.name not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice names {choice.name!r}, which is not among the tools", param=f"{param}.name")
    return choice


def openai_tool_choice(value: str | dict[str, Any] | None, *, nested: bool) -> ToolChoice | None:
    """OpenAI's ``tool_choice``: a mode, or a function named at ``function.name`` (Chat,
    ``nested``) or at ``name`` (Responses)."""
    if value is None:
        return None
    shape = '{"type": "function", "function": {"name": ...}}' if nested else '{"type": "function", "name": ...}'
    if isinstance(value, str):
        if value in _MODES:
            return _MODES[value]
        raise InvalidRequest(f"tool_choice must be 'auto', 'none', 'required' or {shape}", param="tool_choice")
    holder = value.get("function") if nested else value
    name = holder.get("name") if isinstance(holder, dict) else None
    if value.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequest(f"tool_choice of type {value.get('type')!r} is not supported; use 'auto', 'none', "
                             f"'required' or {shape}", param="tool_choice")
    return NamedTool(name)
