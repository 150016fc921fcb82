"""Responses API requests -> rlgate's conversation and a :class:`ChatRequest`.

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
  messages;
* an ``item_reference`` names an output item of an earlier stored response of the session
  (``rs_…``, ``msg_…``, ``fc_…``: ids made from the response's id) and stands for that item as
  rlgate returned it; an id no such response has is a 400 naming the id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgate.api.common import extra_fields
from rlgate.api.normalize import Sampling, chat_request, openai_tool_choice
from rlgate.api.openai_chat.serving import parse_image_url
from rlgate.api.openai_responses.objects import referenced
from rlgate.api.openai_responses.protocol import (
    IGNORED_PARAMS,
    REFUSED_PARAMS,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImagePart,
    ItemReference,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    MessageItem,
    ReasoningContent,
    ReasoningItem,
    RefusalPart,
    ResponseCreateRequest,
)
from rlgate.api.openai_responses.tools import ResponseTools, custom_call, local_shell_call, response_tools
from rlgate.chat.conversation import ContentPart, Message, TextPart, ToolCall
from rlgate.core.request import ChatRequest
from rlgate.errors import InvalidRequest
from rlgate.trajectory.interaction import Session

__all__ = ["convert_input", "ignored_params", "previous_conversation", "to_chat_request"]


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


Resolved = str | Message | ToolCall  # what an item reference stands for: reasoning, a reply's text, a call


def stored_item(session: Session, item_id: str) -> Resolved | None:
    """The output item ``item_id`` of a completed, stored response of ``session``, in the form the
    input items become (reasoning text, the reply's text as an assistant message, the model's call)."""
    ref = referenced(item_id)
    prev = session.interactions.get(ref[0]) if ref is not None else None
    if ref is None or prev is None or not prev.completed or not prev.client_store or prev.api != "responses":
        return None
    reply, kind, index = prev.output_message, ref[1], ref[2]
    if reply is None:
        return None
    if kind == "reasoning":
        return reply.reasoning or None
    if kind == "message":
        return Message(role="assistant", content=[p for p in reply.content if isinstance(p, TextPart)]) \
            if reply.text else None
    return reply.tool_calls[index] if index < len(reply.tool_calls) else None



def _add_call(messages: list[Message], call: ToolCall, open_turn: bool, reasoning: str | None) -> None:
    """A tool call joins the open assistant turn, or starts one (carrying the pending reasoning)."""
    if open_turn:
        messages[-1].tool_calls.append(call)
    else:
        messages.append(Message(role="assistant", tool_calls=[call], reasoning=reasoning or None))

def convert_input(items: list[Any], history: list[Message] | None = None,
                  tools: ResponseTools | None = None,
                  resolve: Callable[[str], Resolved | None] | None = None) -> list[Message]:
    """Input items -> messages, appended to ``history`` (the previous response's conversation).
    ``tools`` maps echoed namespace / custom / local shell calls back to the model's calls;
    ``resolve`` finds what an ``item_reference`` names (None: references are unknown)."""
    tools = tools or ResponseTools()
    messages = list(history or [])
    calls = {tc.id: tc.name for m in messages for tc in m.tool_calls}  # call_id -> function name
    open_turn = False  # the last message is an assistant turn that function_call items extend
    reasoning: str | None = None  # for the next assistant turn
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, ItemReference):
            found = resolve(item.id) if resolve is not None else None
            if found is None:
                raise InvalidRequest(f"Item with id {item.id!r} not found.", param=f"{where}.id",
                                     code="item_not_found")
            if isinstance(found, str):
                item = ReasoningItem(type="reasoning", content=[ReasoningContent(text=found)])
            elif isinstance(found, Message):
                messages.append(Message(role="assistant", content=list(found.content), reasoning=reasoning or None))
                open_turn, reasoning = True, None
                continue
            else:
                _add_call(messages, found, open_turn, reasoning)
                open_turn, reasoning = True, None
                calls[found.id] = found.name
                continue
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
            _add_call(messages, call, open_turn, reasoning)
            open_turn, reasoning = True, None
            calls[item.call_id] = call.name
        elif isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem, LocalShellCallOutputItem)):
            shell = isinstance(item, LocalShellCallOutputItem)
            call_id = item.id if shell else item.call_id  # type: ignore[union-attr]
            if call_id not in calls:
                raise InvalidRequest(
                    f"{where}: no {item.type.removesuffix('_output')} with call_id {call_id!r} comes before "
                    f"this {item.type}",
                    param=f"{where}.{'id' if shell else 'call_id'}",
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
    messages = convert_input(items, history, tools, lambda item_id: stored_item(session, item_id))
    sampling = Sampling(max_tokens=body.max_output_tokens, max_total_tokens=body.max_total_tokens,
                        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
                        store=body.store)
    return chat_request(messages, tools.specs, openai_tool_choice(body.tool_choice, nested=False), sampling,
                        template_kwargs=body.chat_template_kwargs, messages_param="input")


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
