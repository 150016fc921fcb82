"""Responses API: wire request -> ChatRequest -> generation -> Response object / SSE events.

Input items become rlgate's internal messages the way the gateway's own output
becomes one assistant turn, so a client that appends ``response.output`` (plus its
``function_call_output`` items) to its input sends back exactly the conversation the
trajectory recorded, and the new request extends it:

* a ``reasoning`` item gives the reasoning of the following assistant turn;
* an assistant ``message`` and the ``function_call`` items right after it form ONE
  assistant message (text + tool calls); consecutive ``function_call`` items without a
  message form one assistant message too;
* a ``function_call_output`` becomes a tool message (its ``call_id`` must name an
  earlier ``function_call``);
* ``instructions`` become a leading system message; ``developer`` messages are system
  messages.

Output items are, in this order: one ``reasoning`` item (when a reasoning parser
produced reasoning), one ``message`` item (when there is text), one ``function_call``
item per tool call. Text is never dropped because there are tool calls. Streaming
emits the same items (function-call items once the text is complete, so a streamed
and a non-streamed response have the same items in the same order).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlgate.api.common import extra_fields, sse
from rlgate.api.keepalive import KeepAlive, with_keepalive
from rlgate.api.openai_chat.serving import parse_image_url
from rlgate.api.openai_responses.protocol import (
    IGNORED_PARAMS,
    REFUSED_PARAMS,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImagePart,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    MessageItem,
    ReasoningItem,
    RefusalPart,
    ResponseCreateRequest,
)
from rlgate.api.openai_responses.tools import ResponseTools, call_item, custom_call, local_shell_call, response_tools
from rlgate.chat.conversation import ContentPart, Message, TextPart, ToolCall, ToolSpec
from rlgate.chat.output import ContentDelta, ReasoningDelta, ToolCallDelta, openai_call_id
from rlgate.core.generation import Finished, GenerationService, Prepared
from rlgate.core.request import ChatRequest
from rlgate.errors import ContextLengthExceeded, GatewayError, InvalidRequest
from rlgate.trajectory.interaction import Session

log = logging.getLogger("rlgate.api.responses")

ID_PREFIX = "resp_"


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def new_call_id() -> str:
    """``call_…``: the ``call_id`` of a generated function call."""
    return openai_call_id()


# --------------------------------------------------------------------------- request


def _content(content: str | list[Any], where: str) -> list[ContentPart]:
    if isinstance(content, str):
        return [TextPart(content)] if content else []
    parts: list[ContentPart] = []
    for j, p in enumerate(content):
        if isinstance(p, InputImagePart):
            if not p.image_url:
                raise InvalidRequest(
                    "input_image needs an image_url (a data: URL or a URL); file_id inputs are not supported",
                    param=f"{where}[{j}].image_url",
                )
            parts.append(parse_image_url(p.image_url))
        elif isinstance(p, RefusalPart):
            if p.refusal:
                parts.append(TextPart(p.refusal))
        elif p.text:  # input_text / output_text
            parts.append(TextPart(p.text))
    return parts


def _reasoning_text(item: ReasoningItem) -> str:
    if item.content:
        return "".join(c.text for c in item.content)
    return "\n\n".join(s.text for s in item.summary)


def convert_input(items: list[Any], history: list[Message] | None = None,
                  tools: ResponseTools | None = None) -> list[Message]:
    """Input items -> messages, appended to ``history`` (the previous response's conversation)."""
    tools = tools or ResponseTools()
    messages = list(history or [])
    calls = {tc.id: tc.name for m in messages for tc in m.tool_calls}  # call_id -> function name
    open_turn = False  # the last message is an assistant turn that function_call items extend
    reasoning: str | None = None  # for the next assistant turn
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, ReasoningItem):
            text = _reasoning_text(item)
            reasoning = text if reasoning is None else reasoning + "\n\n" + text
            open_turn = False  # reasoning starts a new assistant turn
        elif isinstance(item, MessageItem):
            parts = _content(item.content, f"{where}.content")
            if item.role == "assistant":
                messages.append(Message(role="assistant", content=parts, reasoning=reasoning or None))
                open_turn = True
            else:
                messages.append(Message(role="user" if item.role == "user" else "system", content=parts))
                open_turn = False
            reasoning = None  # reasoning not followed by an assistant turn is dropped
        elif isinstance(item, (FunctionCallItem, CustomToolCallItem, LocalShellCallItem)):
            if isinstance(item, FunctionCallItem):
                call = ToolCall(item.call_id, tools.model_name(item.name, item.namespace), item.arguments)
            elif isinstance(item, CustomToolCallItem):
                call = custom_call(tools, item.call_id, item.name, item.namespace, item.input)
            else:
                call = local_shell_call(item.call_id, item.action)
            if open_turn:
                messages[-1].tool_calls.append(call)
            else:
                messages.append(Message(role="assistant", tool_calls=[call], reasoning=reasoning or None))
                open_turn = True
            reasoning = None
            calls[item.call_id] = call.name
        elif isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem, LocalShellCallOutputItem)):
            call_id = item.id if isinstance(item, LocalShellCallOutputItem) else item.call_id
            if call_id not in calls:
                what = item.type.removesuffix("_output")
                raise InvalidRequest(
                    f"{where}: no {what} with call_id {call_id!r} comes before this {item.type}",
                    param=f"{where}.{'id' if isinstance(item, LocalShellCallOutputItem) else 'call_id'}",
                )
            messages.append(Message(
                role="tool",
                content=_content(item.output, f"{where}.output"),
                tool_call_id=call_id,
                name=calls[call_id],
            ))
            open_turn = False
            reasoning = None
        else:  # pragma: no cover - the protocol's discriminator admits nothing else
            raise InvalidRequest(f"{where}: unsupported input item", param=where)
    return messages


def previous_conversation(session: Session, response_id: str) -> list[Message]:
    """The request messages of a stored response of this session, plus its reply."""
    prev = session.interactions.get(response_id)
    if prev is None or not prev.completed or prev.output_message is None or not prev.client_store:
        raise InvalidRequest(
            f"previous response {response_id!r} not found: previous_response_id must name a completed "
            "response of this session that was stored (store not false)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return [*prev.messages, prev.output_message]


def _tool_choice(choice: str | dict[str, Any] | None, tools: list[ToolSpec]) -> Any:
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidRequest("tool_choice must be 'auto', 'none', 'required' or "
                                 '{"type": "function", "name": ...}', param="tool_choice")
        if choice == "required" and not tools:
            raise InvalidRequest("tool_choice 'required' needs tools", param="tool_choice")
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise InvalidRequest(
            f"tool_choice of type {choice.get('type')!r} is not supported; use 'auto', 'none', 'required' or "
            '{"type": "function", "name": ...}',
            param="tool_choice",
        )
    if choice["name"] not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice names {choice['name']!r}, which is not among the tools",
                             param="tool_choice.name")
    return {"type": "function", "name": choice["name"]}


def to_chat_request(body: ResponseCreateRequest, session: Session, tools: ResponseTools | None = None
                    ) -> ChatRequest:
    """``tools``: :func:`~rlgate.api.openai_responses.tools.response_tools` of ``body.tools``."""
    tools = tools if tools is not None else response_tools(body.tools)
    for name, why in REFUSED_PARAMS.items():
        if getattr(body, name) is not None:
            raise InvalidRequest(why, param=name)
    if body.background:
        raise InvalidRequest("background responses are not supported", param="background")
    if body.input is None:
        raise InvalidRequest("input is required", param="input")
    if isinstance(body.input, list) and not body.input:
        raise InvalidRequest("input must contain at least one item", param="input")
    history = previous_conversation(session, body.previous_response_id) if body.previous_response_id else []
    if body.instructions is not None:
        # The instructions of a previous response are replaced, not repeated.
        system = Message.of("system", body.instructions)
        if history and history[0].role == "system":
            history[0] = system
        else:
            history.insert(0, system)
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    messages = convert_input(items, history, tools)
    return ChatRequest(
        messages=messages,
        tools=tools.specs,
        tool_choice=_tool_choice(body.tool_choice, tools.specs),
        max_tokens=body.max_output_tokens,
        max_total_tokens=body.max_total_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        store=True if body.store is None else body.store,
        template_kwargs=dict(body.chat_template_kwargs or {}),
    )


def ignored_params(body: ResponseCreateRequest, tools: ResponseTools | None = None) -> list[str]:
    names = [n for n in IGNORED_PARAMS if getattr(body, n) is not None]
    names += (tools if tools is not None else response_tools(body.tools)).ignored  # hosted tools
    if body.parallel_tool_calls is False:  # the model may still make several calls
        names.append("parallel_tool_calls")
    if body.truncation == "auto":  # rlgate never truncates; a too-long prompt is a 400
        names.append("truncation")
    if body.reasoning is not None and (body.reasoning.effort is not None or body.reasoning.summary is not None):
        names.append("reasoning")
    if body.text is not None:
        if body.text.format and body.text.format.get("type", "text") != "text":
            names.append("text.format")  # no constrained decoding
        if body.text.verbosity is not None:
            names.append("text.verbosity")
    if body.tool_choice == "required" or isinstance(body.tool_choice, dict):
        names.append("tool_choice")  # the reply is parsed for calls, but the model is not forced to call
    if any(getattr(t, "strict", None) for t in body.tools or []):
        names.append("tools.strict")  # arguments are not constrained to the schema
    names += [f"include:{inc}" for inc in body.include or []]
    return sorted(set(names + extra_fields(body)))


# --------------------------------------------------------------------------- response


@dataclass
class ResponseContext:
    """What a response echoes from its request, fixed when the request arrives."""

    echo: dict[str, Any]
    tools: ResponseTools = field(default_factory=ResponseTools)  # how calls become output items
    created_at: int = field(default_factory=lambda: int(time.time()))


def context(body: ResponseCreateRequest, model: str, tools: ResponseTools | None = None) -> ResponseContext:
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
        "store": True if body.store is None else body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": text,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": tools.echo,
        "top_p": 1.0 if body.top_p is None else body.top_p,
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
    reasoning_tokens = min(len(service.renderer.encode(f.reasoning)), f.completion_tokens) if f.reasoning else 0
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
    """Ids of a response's output items (the same in the streamed events and the final object)."""

    reasoning: str = field(default_factory=lambda: new_id("rs_"))
    message: str = field(default_factory=lambda: new_id("msg_"))
    calls: list[str] = field(default_factory=list)

    def call(self, index: int) -> str:
        while len(self.calls) <= index:
            self.calls.append(new_id("fc_"))
        return self.calls[index]


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


async def complete(service: GenerationService, prepared: Prepared, ctx: ResponseContext) -> dict[str, Any]:
    f = await service.complete(prepared)
    return final_response(service, ctx, f, output_items(f.reasoning, f.content, f.tool_calls, f.finish_reason,
                                                        ItemIds(), ctx.tools))


def _failure_code(exc: GatewayError) -> str:
    if isinstance(exc, ContextLengthExceeded):
        return exc.code or "context_length_exceeded"
    return "rate_limit_exceeded" if exc.status == 429 else "server_error"


async def failed_stream(ctx: ResponseContext, exc: GatewayError) -> AsyncIterator[bytes]:
    """A stream that fails before generating: what a streamed request gets for a prompt that does
    not fit. Codex reads ``response.failed`` with ``error.code == "context_length_exceeded"`` as
    "context window exceeded" (and compacts); a 400 before the stream would be a fatal error to it."""
    seq = itertools.count()
    rid = new_id(ID_PREFIX)

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(seq), **fields}, event=kind)

    start = response_json(ctx, rid, status="in_progress", output=[])
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    yield event("error", code=exc.code or exc.openai_type, message=exc.message, param=exc.param)
    yield event("response.failed", response=response_json(
        ctx, rid, status="failed", output=[], error={"code": _failure_code(exc), "message": exc.message}))


async def stream_events(service: GenerationService, prepared: Prepared, ctx: ResponseContext
                        ) -> AsyncIterator[bytes]:
    """SSE events, in the Responses API's order (see module docstring and docs/openai-responses.md)."""
    seq = itertools.count()
    rid = prepared.interaction_id

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(seq), **fields}, event=kind)

    ids = ItemIds()
    done: list[dict[str, Any]] = []  # output items finished so far (for response.failed)
    next_index = 0
    reasoning_text = content_text = ""
    reasoning_index: int | None = None  # output index of the open reasoning item
    message_index: int | None = None  # output index of the open message item
    reasoning_closed = False
    calls: list[ToolCallDelta] = []

    start = response_json(ctx, rid, status="in_progress", output=[])
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)

    def close_reasoning(status: str) -> list[bytes]:
        nonlocal reasoning_index, reasoning_closed
        idx, reasoning_index, reasoning_closed = reasoning_index, None, True
        if idx is None:
            return []
        item = reasoning_item(ids.reasoning, reasoning_text, status)
        done.append(item)
        part = {"type": "reasoning_text", "text": reasoning_text}
        where = {"item_id": ids.reasoning, "output_index": idx}
        return [
            event("response.reasoning_text.done", **where, content_index=0, text=reasoning_text),
            event("response.content_part.done", **where, content_index=0, part=part),
            event("response.output_item.done", output_index=idx, item=item),
        ]

    try:
        async with contextlib.aclosing(with_keepalive(service.run(prepared),
                                                      service.config.stream_keepalive_interval)) as run:
            async for ev in run:
                if isinstance(ev, KeepAlive):  # the Responses API has no ping event: repeat the lifecycle event
                    yield event("response.in_progress", response=start)
                elif isinstance(ev, ReasoningDelta):
                    reasoning_text += ev.text
                    if reasoning_closed:  # cannot happen with the registered parsers (reasoning comes first)
                        continue
                    if reasoning_index is None:
                        reasoning_index, next_index = next_index, next_index + 1
                        yield event("response.output_item.added", output_index=reasoning_index,
                                    item={**reasoning_item(ids.reasoning, "", "in_progress"), "content": []})
                        yield event("response.content_part.added", item_id=ids.reasoning,
                                    output_index=reasoning_index, content_index=0,
                                    part={"type": "reasoning_text", "text": ""})
                    yield event("response.reasoning_text.delta", item_id=ids.reasoning,
                                output_index=reasoning_index, content_index=0, delta=ev.text)
                elif isinstance(ev, ContentDelta):
                    for frame in close_reasoning("completed"):
                        yield frame
                    content_text += ev.text
                    if message_index is None:
                        message_index, next_index = next_index, next_index + 1
                        yield event("response.output_item.added", output_index=message_index,
                                    item=message_item(ids.message, None, "in_progress"))
                        yield event("response.content_part.added", item_id=ids.message,
                                    output_index=message_index, content_index=0, part=output_text_part(""))
                    yield event("response.output_text.delta", item_id=ids.message, output_index=message_index,
                                content_index=0, delta=ev.text, logprobs=[])
                elif isinstance(ev, ToolCallDelta):
                    for frame in close_reasoning("completed"):
                        yield frame
                    calls.append(ev)  # announced once the text is complete (see module docstring)
                elif isinstance(ev, Finished):
                    cut = ev.finish_reason in ("length", "abort")
                    for frame in close_reasoning("incomplete" if cut and not content_text and not calls
                                                 else "completed"):
                        yield frame
                    if message_index is not None:
                        item = message_item(ids.message, content_text, "incomplete" if cut else "completed")
                        done.append(item)
                        where = {"item_id": ids.message, "output_index": message_index, "content_index": 0}
                        yield event("response.output_text.done", **where, text=content_text, logprobs=[])
                        yield event("response.content_part.done", **where, part=output_text_part(content_text))
                        yield event("response.output_item.done", output_index=message_index, item=item)
                    for i, call in enumerate(calls):
                        idx, next_index = next_index, next_index + 1
                        item = call_item(ctx.tools, ids.call(i), call, "completed")
                        yield event("response.output_item.added", output_index=idx,
                                    item=call_item(ctx.tools, item["id"], call, "in_progress", complete=False))
                        where = {"item_id": item["id"], "output_index": idx}
                        if item["type"] == "function_call":
                            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
                            yield event("response.function_call_arguments.done", **where, arguments=item["arguments"])
                        elif item["type"] == "custom_tool_call":
                            yield event("response.custom_tool_call_input.delta", **where, delta=item["input"])
                            yield event("response.custom_tool_call_input.done", **where, input=item["input"])
                        done.append(item)
                        yield event("response.output_item.done", output_index=idx, item=item)
                    final = final_response(service, ctx, ev, output_items(reasoning_text, content_text, calls,
                                                                           ev.finish_reason, ids, ctx.tools))
                    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
                    yield event(kind, response=final)
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band, then end it
        if not isinstance(exc, GatewayError):
            log.exception("responses stream %s failed", rid)
            exc = GatewayError(f"internal error: {exc!r}", status=500, code="internal_error")
        yield event("error", code=exc.code or exc.openai_type, message=exc.message, param=exc.param)
        failed = response_json(ctx, rid, status="failed", output=done,
                               error={"code": _failure_code(exc), "message": exc.message})
        yield event("response.failed", response=failed)
