"""Response objects and output items, the same in a JSON answer and in stream events.

Output items are, in this order: one ``reasoning`` item (when a reasoning parser produced
reasoning), one ``message`` item (when there is text), one ``function_call`` item per
tool call. Text is never dropped because there are tool calls.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlgate.api.openai_responses.protocol import ResponseCreateRequest
from rlgate.api.openai_responses.tools import ResponseTools, call_item, response_tools
from rlgate.chat.conversation import ToolCall
from rlgate.chat.output import ToolCallDelta
from rlgate.core.generation import Finished, GenerationService
from rlgate.core.request import ChatRequest

__all__ = [
    "ItemIds",
    "referenced",
    "ResponseContext",
    "context",
    "final_response",
    "message_item",
    "new_id",
    "output_items",
    "output_text_part",
    "reasoning_item",
    "response_json",
    "status_of",
    "usage_json",
]


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


@dataclass
class ResponseContext:
    """What a response echoes from its request, fixed when the request arrives."""

    echo: dict[str, Any]
    tools: ResponseTools = field(default_factory=ResponseTools)  # how calls become output items
    created_at: int = field(default_factory=lambda: int(time.time()))


def context(body: ResponseCreateRequest, chat: ChatRequest, model: str, tools: ResponseTools | None = None
            ) -> ResponseContext:
    """The echo of ``body``, with the sampling values the request got (``chat``)."""
    tools = tools if tools is not None else response_tools(body.tools)
    text: dict[str, Any] = {"format": (body.text.format if body.text and body.text.format else {"type": "text"})}
    if body.text is not None and body.text.verbosity is not None:
        text["verbosity"] = body.text.verbosity
    return ResponseContext(tools=tools, echo={
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None,
                      "summary": body.reasoning.summary if body.reasoning else None},
        "store": chat.store,
        "temperature": chat.temperature,
        "text": text,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": tools.echo,
        "top_p": chat.top_p,
        "truncation": body.truncation or "disabled",
        "user": body.user,
        "metadata": dict(body.metadata or {}),
    })


def response_json(
    ctx: ResponseContext,
    response_id: str,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    incomplete_details: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    e = ctx.echo
    return {
        "id": response_id,
        "object": "response",
        "created_at": ctx.created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete_details,
        "instructions": e["instructions"],
        "max_output_tokens": e["max_output_tokens"],
        "model": e["model"],
        "output": output,
        "parallel_tool_calls": e["parallel_tool_calls"],
        "previous_response_id": e["previous_response_id"],
        "reasoning": e["reasoning"],
        "store": e["store"],
        "temperature": e["temperature"],
        "text": e["text"],
        "tool_choice": e["tool_choice"],
        "tools": e["tools"],
        "top_p": e["top_p"],
        "truncation": e["truncation"],
        "usage": usage,
        "user": e["user"],
        "metadata": e["metadata"],
    }


def usage_json(service: GenerationService, f: Finished) -> dict[str, Any]:
    # Reasoning tokens are counted by re-encoding the reasoning text (the markup and the
    # exact token split are not tracked per token); never more than the output.
    reasoning_tokens = 0
    if f.reasoning:
        reasoning_tokens = min(len(service.tokenizer.encode(f.reasoning, add_special_tokens=False)), f.completion_tokens)
    return {
        "input_tokens": f.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": f.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    }


def status_of(finish_reason: str) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "abort":
        return "incomplete", None
    return "completed", None


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [] if text is None else [output_text_part(text)]}


@dataclass
class ItemIds:
    """Ids of a response's output items (the same in the streamed events and the final object).

    Made from the response's id (:meth:`of`): ``resp_X`` has the items ``rs_X``, ``msg_X`` and
    ``fc_X0000``, ``fc_X0001``... (the call's index in 4 hex digits), so an ``item_reference`` names
    its response (:func:`referenced`)."""

    reasoning: str = field(default_factory=lambda: new_id("rs_"))
    message: str = field(default_factory=lambda: new_id("msg_"))
    calls: list[str] = field(default_factory=list)
    call_prefix: str | None = None  # "fc_X": call ids are this + index in 4 hex digits (None: random ids)

    @classmethod
    def of(cls, response_id: str) -> ItemIds:
        x = response_id.removeprefix("resp_")
        return cls(reasoning=f"rs_{x}", message=f"msg_{x}", call_prefix=f"fc_{x}")

    def call(self, index: int) -> str:
        while len(self.calls) <= index:
            n = len(self.calls)
            self.calls.append(new_id("fc_") if self.call_prefix is None else f"{self.call_prefix}{n:04x}")
        return self.calls[index]


def referenced(item_id: str) -> tuple[str, str, int] | None:
    """``(response id, kind, call index)`` of an output item id made by :meth:`ItemIds.of` (kind:
    reasoning, message or call), or None."""
    kind, _, rest = item_id.partition("_")
    if kind == "fc":
        x, n = rest[:-4], rest[-4:]
        ok = len(rest) > 4 and all(ch in "0123456789abcdef" for ch in n)
        return (f"resp_{x}", "call", int(n, 16)) if ok else None
    if kind in ("rs", "msg") and rest:
        return f"resp_{rest}", "reasoning" if kind == "rs" else "message", 0
    return None


def output_items(
    reasoning: str, content: str, calls: Sequence[ToolCall | ToolCallDelta], finish_reason: str, ids: ItemIds,
    tools: ResponseTools,
) -> list[dict[str, Any]]:
    cut = finish_reason in ("length", "abort")
    items: list[dict[str, Any]] = []
    if reasoning:
        cut_reasoning = cut and not content and not calls
        items.append(reasoning_item(ids.reasoning, reasoning, "incomplete" if cut_reasoning else "completed"))
    if content:
        items.append(message_item(ids.message, content, "incomplete" if cut else "completed"))
    for i, call in enumerate(calls):
        items.append(call_item(tools, ids.call(i), call, "completed"))
    return items


def final_response(
    service: GenerationService, ctx: ResponseContext, f: Finished, output: list[dict[str, Any]]
) -> dict[str, Any]:
    status, details = status_of(f.finish_reason)
    return response_json(ctx, f.interaction_id, status=status, output=output, usage=usage_json(service, f),
                         incomplete_details=details)
