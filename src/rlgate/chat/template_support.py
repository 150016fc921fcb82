"""What a chat template can show the model, and what it leaves out of a request (issue 40).

A request may carry things the model's chat template never renders: SmolLM2's template writes
``role + content`` and nothing else, so an agent's ``tools=`` vanished from the prompt while the
gateway answered 200 and ``rlgate check`` said "check passed". :func:`probe` finds out once per
renderer, by rendering small conversations that hold a marker and looking for it in the prompt:

==================  ======================================================================
part                rendered when the marker shows up in the prompt
==================  ======================================================================
``tools``           a tool's name, from ``tools=`` (the function list)
``tool_calls``      a history assistant turn's call arguments (a fresh rendering: turns the
                    gateway bridges keep the tokens the model generated)
``tool_results``    a tool result's content
``reasoning``       the reasoning of an assistant turn after the last user message (templates
                    that drop the reasoning of *earlier* turns by design still show this one)
``images``          never: rlgate's engines take token ids, so an image reaches the model as
                    the template's placeholder at most, never as pixels
==================  ======================================================================

A probe the template refuses (a role it does not know) counts as rendered: such a request
fails with a 400 instead of losing something. :func:`dropped` names what one request carries
and the template leaves out; the gateway reports it (``x-rlgate-template-dropped`` header, the
``rlgate_template_dropped_total`` counter, one log line per part, the ``dropped_*`` flags of the
exported samples, ``rlgate check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlgate.chat.conversation import ImagePart, Message, TextPart, ToolCall, ToolSpec
from rlgate.chat.token_text import decode

__all__ = ["PARTS", "TemplateSupport", "dropped", "probe"]

PARTS = ("tools", "tool_calls", "tool_results", "reasoning", "images")
_TOOL = "rlgate_probe_tool"
_ARG = "RLGATE_PROBE_ARGUMENT"
_RESULT = "RLGATE_PROBE_RESULT"
_THOUGHT = "RLGATE_PROBE_THOUGHT"


@dataclass(frozen=True)
class TemplateSupport:
    """Which parts of a request the renderer shows the model (see module docstring)."""

    tools: bool = True
    tool_calls: bool = True
    tool_results: bool = True
    reasoning: bool = True

    def missing(self) -> list[str]:
        """The parts this template never shows (``images`` always)."""
        return [p for p in PARTS[:-1] if not getattr(self, p)] + ["images"]


def _rendered(renderer: Any, tokenizer: Any, marker: str, messages: list[Message],
              tools: list[ToolSpec]) -> bool:
    try:
        ids = renderer.render_ids(messages, tools)
    except Exception:  # noqa: BLE001 - a template that refuses this shape fails such requests with a 400
        return True
    return marker in decode(tokenizer, ids)


def probe(renderer: Any, tokenizer: Any) -> TemplateSupport:
    """What ``renderer`` (any family's prompt renderer) shows; a few renderings, once at startup."""
    tool = ToolSpec(_TOOL, "Probe.", {"type": "object", "properties": {"x": {"type": "string"}}})
    user = Message.of("user", "hi")
    call = ToolCall("call_probe", _TOOL, '{"x": "' + _ARG + '"}')
    calling = Message(role="assistant", content=[], tool_calls=[call], reasoning=_THOUGHT)
    result = Message.of("tool", _RESULT, tool_call_id="call_probe", name=_TOOL)
    history = [user, calling, result]
    return TemplateSupport(
        tools=_rendered(renderer, tokenizer, _TOOL, [user], [tool]),
        tool_calls=_rendered(renderer, tokenizer, _ARG, history, [tool]),
        tool_results=_rendered(renderer, tokenizer, _RESULT, history, [tool]),
        reasoning=_rendered(renderer, tokenizer, _THOUGHT, history, [tool]),
    )


def dropped(support: TemplateSupport, rendered: list[Message], tools: list[ToolSpec]) -> list[str]:
    """The parts of a request the template leaves out: ``tools`` when it offers tools the template
    never shows; the others when a message the gateway rendered (not a bridged parent) holds them."""
    out: list[str] = []
    if tools and not support.tools:
        out.append("tools")
    if not support.tool_calls and any(m.role == "assistant" and m.tool_calls for m in rendered):
        out.append("tool_calls")
    if not support.tool_results and any(m.role == "tool" and any(isinstance(p, TextPart) and p.text
                                                                 for p in m.content) for m in rendered):
        out.append("tool_results")
    if not support.reasoning and any(m.role == "assistant" and (m.reasoning or "").strip() for m in rendered):
        out.append("reasoning")
    if any(isinstance(p, ImagePart) for m in rendered for p in m.content):
        out.append("images")
    return out
