"""``--tool-prompt auto``: tools described in the system message, for a template that renders none.

Some chat templates render no tools at all (SmolLM2's writes ``role + content`` only): an agent's
``tools=`` never reach the prompt, and the gateway says so (``chat/template_support.py``). With
``GatewayConfig.tool_prompt = "auto"`` (``rlgate serve --tool-prompt auto``, ``gateway: {tool_prompt:
auto}`` in a training config) the gateway describes them itself, in a documented format that the
active tool parser reads back. One format exists, for the ``hermes`` parser (SmolLM2, and any
``<tool_call>`` template): the function-calling prompt of SmolLM2's model card, the form its
function-calling data used::

    <system text, if any>

    You are an expert in composing functions. You are given a question and a set of possible
    functions. Based on the question, you will need to make one or more function/tool calls to
    achieve the purpose. If none of the functions can be used, answer without calling a tool.

    You have access to the following tools:
    <tools>[{"name": ..., "description": ..., "parameters": {...}}, ...]</tools>

    To call tools, reply with only this, in this format, and nothing else:
    <tool_call>[{"name": "func_name1", "arguments": {"argument1": "value1"}}]</tool_call>
    After the tool results, give the final answer.

It goes at the end of the conversation's first system message (a new one when there is none: for
SmolLM2 that replaces the template's default "You are a helpful AI assistant named SmolLM"). In a
fresh rendering an earlier assistant turn's tool calls, which such a template drops too, are
written as the ``<tool_call>[...]</tool_call>`` text the model produced. Turns the gateway bridges
keep the tokens the model generated, as always. The description is the same on every turn of a
conversation, so the token-exact bridge holds.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from rlgate.chat.conversation import Message, TextPart, ToolCall, ToolSpec
from rlgate.chat.families.base import ParentTurn, PromptRenderer
from rlgate.chat.render_cache import RenderCache
from rlgate.chat.template_support import TemplateSupport, probe

__all__ = ["TOOL_PROMPT_PARSERS", "ToolPromptRenderer", "call_text", "describe_tools", "tool_prompt_renderer"]

TOOL_PROMPT_PARSERS = ("hermes", "qwen", "qwen25")  # the parsers that read the format below (one registration)

_INTRO = ("You are an expert in composing functions. You are given a question and a set of possible functions. "
          "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
          "If none of the functions can be used, answer without calling a tool.")
_FORMAT = ("To call tools, reply with only this, in this format, and nothing else:\n"
           '<tool_call>[{"name": "func_name1", "arguments": {"argument1": "value1"}}]</tool_call>\n'
           "After the tool results, give the final answer.")


def describe_tools(tools: list[ToolSpec]) -> str:
    """The tool description (see module docstring)."""
    listed = [{"name": t.name, **({"description": t.description} if t.description else {}),
               "parameters": t.parameters} for t in tools]
    return f"{_INTRO}\n\nYou have access to the following tools:\n<tools>{json.dumps(listed)}</tools>\n\n{_FORMAT}"


def call_text(calls: list[ToolCall]) -> str:
    """Tool calls as the format writes them."""
    return "<tool_call>" + json.dumps([{"name": c.name, "arguments": c.arguments_obj()} for c in calls]) + "</tool_call>"


def _with_description(system: Message | None, tools: list[ToolSpec]) -> Message:
    text = describe_tools(tools)
    if system is None:
        return Message.of("system", text)
    return replace(system, content=[*system.content, TextPart(("\n\n" if system.text else "") + text)])


class ToolPromptRenderer:
    """A family's renderer with the tools described in the system message (see module docstring)."""

    def __init__(self, inner: PromptRenderer, support: TemplateSupport) -> None:
        self.inner = inner
        self.name = f"{inner.name}+tool_prompt"
        self._calls_as_text = not support.tool_calls

    def __getattr__(self, name: str) -> Any:  # tokenizer, encode, decode... of the family's renderer
        return getattr(self.inner, name)

    def _calls(self, messages: list[Message]) -> list[Message]:
        if not self._calls_as_text:
            return messages
        return [replace(m, content=[*m.content, TextPart(call_text(m.tool_calls))], tool_calls=[])
                if m.role == "assistant" and m.tool_calls else m for m in messages]

    def _messages(self, messages: list[Message], tools: list[ToolSpec]) -> list[Message]:
        out = self._calls(messages)
        if out and out[0].role == "system":
            return [_with_description(out[0], tools), *out[1:]]
        return [_with_description(None, tools), *out]

    def render_ids(self, messages: list[Message], tools: list[ToolSpec] | None = None,
                   template_kwargs: dict[str, Any] | None = None, *, max_chars: int | None = None) -> list[int]:
        if tools:
            messages = self._messages(messages, tools)
        return self.inner.render_ids(messages, tools, template_kwargs, max_chars=max_chars)

    def bridge_ids(self, *, parent: ParentTurn, leading_system: Message | None, new_messages: list[Message],
                   tools: list[ToolSpec] | None = None, template_kwargs: dict[str, Any] | None = None,
                   cache_key: str | None = None, cache: RenderCache | None = None,
                   max_chars: int | None = None) -> list[int]:
        if tools:
            leading_system = _with_description(leading_system, tools)
            new_messages = self._calls(new_messages)
        return self.inner.bridge_ids(parent=parent, leading_system=leading_system, new_messages=new_messages,
                                     tools=tools, template_kwargs=template_kwargs, cache_key=cache_key, cache=cache,
                                     max_chars=max_chars)

    def reasoning_open(self, prompt_ids: list[int]) -> bool:
        return self.inner.reasoning_open(prompt_ids)


def tool_prompt_renderer(renderer: PromptRenderer, tokenizer: Any, mode: str, tool_parser: str | None,
                         family: str) -> tuple[PromptRenderer, TemplateSupport]:
    """The renderer the gateway serves with and what it shows: ``renderer`` itself, or with ``mode``
    "auto" and a template that renders no tools, a :class:`ToolPromptRenderer` around it. ``ValueError``
    when "auto" would need a format the active tool parser does not read."""
    support = probe(renderer, tokenizer)
    if mode != "auto" or support.tools:
        return renderer, support
    if tool_parser not in TOOL_PROMPT_PARSERS:
        raise ValueError(f"--tool-prompt auto: the {family} chat template renders no tools and its tool parser "
                         f"({tool_parser or 'none'}) reads no format rlgate can describe them in (it writes the "
                         f"<tool_call> format of the parsers {', '.join(TOOL_PROMPT_PARSERS)}: --tool-parser hermes)")
    wrapped = ToolPromptRenderer(renderer, support)
    return wrapped, probe(wrapped, tokenizer)
