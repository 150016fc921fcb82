"""Anthropic Messages: wire request -> ChatRequest -> generation -> Message / SSE events.

Request conversion (Anthropic -> rlgate's internal conversation)
-----------------------------------------------------------------
* ``system`` (string or text blocks) -> one leading ``system`` message; the blocks'
  texts are concatenated verbatim (as text parts of any message are).
* a ``{"role": "system"}`` entry of ``messages`` (a mid-conversation system message) ->
  a ``system`` message at its place, rendered as the chat template renders system text;
  Anthropic's placement rules are enforced (not first, right after a user message, then
  an assistant message or the end).
* ``text`` -> text part; ``image`` -> :class:`ImagePart` (base64 data + media type,
  or a URL that is kept as a reference and never fetched).
* assistant ``tool_use`` -> :class:`ToolCall` (arguments = ``json.dumps(input)``);
  ``thinking`` -> the message's ``reasoning``; ``redacted_thinking`` is accepted and
  dropped (its data is encrypted, not text the model wrote).
* user ``tool_result`` -> one ``tool`` message per result, in order, before the
  user's remaining text/images (which, if any, follow as one ``user`` message). The
  result's ``tool_use_id`` must match a ``tool_use`` of an earlier assistant message;
  its ``is_error`` is kept on the tool message.

Response building
-----------------
:class:`BlockBuilder` turns the generation's output events into content blocks,
opening a block lazily when the first event of its kind arrives: ``thinking`` (only
with a reasoning parser), ``text`` (only when there is text), one ``tool_use`` per
tool call. The streamed response emits the builder's events as they happen; the
non-streamed response runs the *same* builder and returns its blocks, so both forms
carry the same content in the same order.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from rlgate.api.anthropic.protocol import (
    COUNT_TOKENS_ALSO_ACCEPTS,
    IGNORED_PARAMS,
    AnthropicToolParam,
    Base64ImageSourceParam,
    CountTokensRequest,
    ImageBlockParam,
    MessageCreateRequest,
    MessageParam,
    RedactedThinkingBlockParam,
    TextBlockParam,
    ThinkingBlockParam,
    ToolChoiceToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
)
from rlgate.api.common import extra_fields, sse, tool_spec
from rlgate.api.keepalive import KeepAlive, with_keepalive
from rlgate.api.normalize import Sampling, chat_request
from rlgate.api.streaming import guard_stream
from rlgate.chat.conversation import ContentPart, ImagePart, Message, TextPart, ToolCall, ToolSpec
from rlgate.chat.output import ContentDelta, OutputEvent, ReasoningDelta, ToolCallDelta
from rlgate.core.generation import Finished, GenerationService, Prepared
from rlgate.core.request import ChatRequest, NamedTool, ToolChoice
from rlgate.errors import InvalidRequest
from rlgate.surfaces import MESSAGES

log = logging.getLogger("rlgate.api.anthropic")

ID_PREFIX = "msg_"
# Thinking blocks carry a signature. rlgate has nothing to sign and ignores signatures sent back,
# but clients treat an empty one as "no signature": pydantic-ai then re-sends the reasoning as a
# user message (the next turn forks). A constant, opaque, non-empty one (base64 of
# "rlgate:unsigned") is sent back unchanged, as the API's are.
SIGNATURE = "cmxnYXRlOnVuc2lnbmVk"


def tool_use_id() -> str:
    """Call ids in Anthropic's style (``toolu_…``)."""
    return "toolu_" + secrets.token_hex(12)


# --------------------------------------------------------------------------- request


def _image(block: ImageBlockParam) -> ImagePart:
    src = block.source
    if isinstance(src, Base64ImageSourceParam):
        return ImagePart(data=src.data, media_type=src.media_type)
    return ImagePart(url=src.url)  # never fetched


def _parts(blocks: Sequence[TextBlockParam | ImageBlockParam]) -> list[ContentPart]:
    parts: list[ContentPart] = []
    for b in blocks:
        if isinstance(b, TextBlockParam):
            if b.text:
                parts.append(TextPart(b.text))
        else:
            parts.append(_image(b))
    return parts


def _refuse(block_type: str, role: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"a {role} message cannot contain a {block_type!r} block", param=param)


def _convert_user(m: MessageParam, i: int, calls: dict[str, str]) -> list[Message]:
    results: list[Message] = []
    rest: list[TextBlockParam | ImageBlockParam] = []
    for j, b in enumerate(m.content):
        param = f"messages[{i}].content[{j}]"
        if isinstance(b, ToolResultBlockParam):
            if b.tool_use_id not in calls:
                raise InvalidRequest(
                    f"tool_result block refers to tool_use_id {b.tool_use_id!r}, which matches no tool_use "
                    "block of an earlier assistant message",
                    param=f"{param}.tool_use_id",
                )
            results.append(Message(
                role="tool",
                content=_parts(b.content or []),
                tool_call_id=b.tool_use_id,
                name=calls[b.tool_use_id],
                is_error=bool(b.is_error),
            ))
        elif isinstance(b, (TextBlockParam, ImageBlockParam)):
            rest.append(b)
        else:
            raise _refuse(b.type, "user", param)
    out = results
    if rest or not results:
        out.append(Message(role="user", content=_parts(rest)))
    return out


def _convert_assistant(m: MessageParam, i: int, calls: dict[str, str]) -> Message:
    parts: list[ContentPart] = []
    tool_calls: list[ToolCall] = []
    reasoning: list[str] = []
    for j, b in enumerate(m.content):
        if isinstance(b, TextBlockParam):
            if b.text:
                parts.append(TextPart(b.text))
        elif isinstance(b, ToolUseBlockParam):
            tool_calls.append(ToolCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False)))
            calls[b.id] = b.name
        elif isinstance(b, ThinkingBlockParam):
            if b.thinking:
                reasoning.append(b.thinking)
        elif isinstance(b, RedactedThinkingBlockParam):
            pass  # encrypted by its producer: not text to render (see module docstring)
        else:
            raise _refuse(b.type, "assistant", f"messages[{i}].content[{j}]")
    return Message(role="assistant", content=parts, tool_calls=tool_calls, reasoning="\n".join(reasoning) or None)


def convert_system(body: MessageCreateRequest | CountTokensRequest) -> Message | None:
    """``system`` as one leading system message (None when there is no system text)."""
    parts = _parts(body.system) if body.system else []
    return Message(role="system", content=parts) if parts else None


def _mid_conversation_system(messages: list[MessageParam], i: int) -> Message:
    """A mid-conversation system message, checked against Anthropic's placement rules: not
    first, right after a user message, followed by an assistant message or nothing; text only."""
    where = f"messages[{i}]"
    if i == 0:
        raise InvalidRequest(f"{where}: a system message cannot be the first message; put the system prompt in "
                             "the top-level system field", param=f"{where}.role")
    if messages[i - 1].role != "user":
        raise InvalidRequest(f"{where}: a system message in messages must come right after a user message",
                             param=f"{where}.role")
    if i + 1 < len(messages) and messages[i + 1].role != "assistant":
        raise InvalidRequest(f"{where}: a system message in messages must be the last message or be followed by "
                             "an assistant message", param=f"{where}.role")
    for j, b in enumerate(messages[i].content):
        if not isinstance(b, TextBlockParam):
            raise InvalidRequest(f"{where}: a system message can only contain text blocks", param=f"{where}.content[{j}]")
    return Message(role="system", content=_parts(messages[i].content))  # type: ignore[arg-type]


def convert_messages(body: MessageCreateRequest | CountTokensRequest) -> list[Message]:
    """``messages`` (without ``system``) as rlgate's conversation."""
    out: list[Message] = []
    calls: dict[str, str] = {}  # tool_use id -> tool name, from earlier assistant messages
    for i, m in enumerate(body.messages):
        if m.role == "user":
            out += _convert_user(m, i, calls)
        elif m.role == "system":
            out.append(_mid_conversation_system(body.messages, i))
        else:
            out.append(_convert_assistant(m, i, calls))
    return out


def convert_tools(tools: list[AnthropicToolParam] | None) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for i, t in enumerate(tools or []):  # unique names: checked by api/normalize.py for every surface
        if t.type not in (None, "custom"):
            raise InvalidRequest(
                f"tool {t.name!r} has type {t.type!r}: Anthropic server tools are not available on rlgate; "
                "define a client tool (name, description, input_schema) instead",
                param=f"tools[{i}].type",
            )
        if t.input_schema is None:
            raise InvalidRequest(f"tool {t.name!r}: input_schema is required", param=f"tools[{i}].input_schema")
        specs.append(tool_spec(t.name, t.description, t.input_schema, f"tools[{i}].input_schema"))
    return specs


def _tool_choice(body: MessageCreateRequest | CountTokensRequest) -> ToolChoice | None:
    """Only ``none`` changes anything (tool calls are not parsed); ``any`` and ``tool`` are
    validated and recorded but not enforced (generation is not constrained)."""
    tc = body.tool_choice
    if tc is None:
        return None
    if isinstance(tc, ToolChoiceToolParam):
        return NamedTool(tc.name)
    modes: dict[str, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}
    return modes[tc.type]


def refuse_threads(body: MessageCreateRequest | CountTokensRequest) -> None:
    """Message threads (``thread``: the server keeps the conversation, a request sends only its new
    messages) are not served: every request must carry the whole conversation for it to be
    rendered and recorded token for token. The SDKs' tool runner threads by default; refused
    with ``thread_unsupported_request`` it sends the same turn again unthreaded."""
    if body.model_extra and "thread" in body.model_extra:
        raise InvalidRequest(
            "message threads are not available on rlgate: send the whole conversation in 'messages'",
            param="thread", code="thread_unsupported_request",
            details={"error_code": "thread_unsupported_request", "unsupported": ["thread"]})


def to_chat_request(body: MessageCreateRequest | CountTokensRequest) -> ChatRequest:
    refuse_threads(body)
    sampling = Sampling()
    if isinstance(body, MessageCreateRequest):
        sampling = Sampling(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                            top_k=body.top_k, seed=body.seed, stop=body.stop_sequences)
    return chat_request(convert_messages(body), convert_tools(body.tools), _tool_choice(body), sampling,
                        system=convert_system(body), template_kwargs=body.chat_template_kwargs)


def ignored_params(body: MessageCreateRequest | CountTokensRequest) -> list[str]:
    if isinstance(body, CountTokensRequest):
        names = [n for n in ("mcp_servers", "thinking") if getattr(body, n) is not None]
        names += [n for n in extra_fields(body) if n not in COUNT_TOKENS_ALSO_ACCEPTS]
    else:
        names = [n for n in IGNORED_PARAMS if getattr(body, n) is not None] + extra_fields(body)
    tools = [t for t in body.tools or [] if isinstance(t, AnthropicToolParam)]
    if any(t.strict for t in tools):
        names.append("tools.strict")  # the input is not constrained to the schema
    for t in tools:
        names += [f"tools.{n}" for n in extra_fields(t)]
    return sorted(set(names))


# --------------------------------------------------------------------------- response


def stop_reason(f: Finished) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``. An aborted generation is reported as end_turn."""
    if f.finish_reason == "tool_calls":
        return "tool_use", None
    if f.finish_reason == "length":
        return "max_tokens", None
    if f.stop_kind == "stop_string":
        return "stop_sequence", f.stop_sequence
    return "end_turn", None


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_json(
    message_id: str, model: str, content: list[dict[str, Any]], reason: str | None, sequence: str | None,
    input_tokens: int, output_tokens: int,
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(input_tokens, output_tokens),
    }


class BlockBuilder:
    """Output events -> content blocks, plus the stream events that build them."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open = False  # the last block is still open (thinking / text)

    def _start(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = self.close()
        self.blocks.append(block)
        self._open = True
        start = {**block, **({"input": {}} if block["type"] == "tool_use" else {})}
        for key in ("text", "thinking", "signature"):  # streamed in deltas (the signature: at the end)
            if key in start:
                start[key] = ""
        events.append(("content_block_start",
                       {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": start}))
        return events

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def feed(self, ev: OutputEvent) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        last = self.blocks[-1] if self._open else None
        if isinstance(ev, ReasoningDelta):
            if last is None or last["type"] != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": SIGNATURE})
            self.blocks[-1]["thinking"] += ev.text
            events.append(self._delta({"type": "thinking_delta", "thinking": ev.text}))
        elif isinstance(ev, ContentDelta):
            if last is None or last["type"] != "text":
                events += self._start({"type": "text", "text": ""})
            self.blocks[-1]["text"] += ev.text
            events.append(self._delta({"type": "text_delta", "text": ev.text}))
        elif isinstance(ev, ToolCallDelta):
            call = ToolCall(ev.id, ev.name, ev.arguments)
            events += self._start({"type": "tool_use", "id": ev.id, "name": ev.name, "input": call.arguments_obj()})
            events.append(self._delta({"type": "input_json_delta", "partial_json": ev.arguments}))
            events += self.close()
        return events

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        """Close the open block, if any."""
        if not self._open:
            return []
        self._open = False
        events: list[tuple[str, dict[str, Any]]] = []
        if self.blocks[-1]["type"] == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": SIGNATURE}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1}))
        return events


async def complete(service: GenerationService, prepared: Prepared, model: str) -> dict[str, Any]:
    builder = BlockBuilder()
    final: Finished | None = None
    async for ev in service.run(prepared, incremental=False):
        if isinstance(ev, Finished):
            final = ev
        else:
            builder.feed(ev)
    assert final is not None
    reason, sequence = stop_reason(final)
    return message_json(final.interaction_id, model, builder.blocks, reason, sequence,
                        final.prompt_tokens, final.completion_tokens)


async def stream_events(service: GenerationService, prepared: Prepared, model: str) -> AsyncIterator[bytes]:
    """SSE: message_start, ping, content blocks, message_delta, message_stop; after a
    failure, one ``error`` event ends the stream (api/streaming.py)."""

    async def frames() -> AsyncGenerator[bytes, None]:
        start = message_json(prepared.interaction_id, model, [], None, None, len(prepared.prompt_ids), 0)
        yield sse({"type": "message_start", "message": start}, event="message_start")
        yield sse({"type": "ping"}, event="ping")
        builder = BlockBuilder()
        async for ev in with_keepalive(service.run(prepared), service.config.stream_keepalive_interval):
            if isinstance(ev, KeepAlive):
                yield sse({"type": "ping"}, event="ping")
            elif isinstance(ev, Finished):
                for name, data in builder.close():
                    yield sse(data, event=name)
                reason, sequence = stop_reason(ev)
                # cumulative usage, input included, as the API now sends it (LangChain's ChatAnthropic
                # reads streamed usage from message_delta alone: it reported 0 input tokens)
                yield sse({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                           "usage": usage(ev.prompt_tokens, ev.completion_tokens)}, event="message_delta")
                yield sse({"type": "message_stop"}, event="message_stop")
            else:
                for name, data in builder.feed(ev):
                    yield sse(data, event=name)

    async for frame in guard_stream(frames(), MESSAGES.stream_error_frames, label=f"messages stream {prepared.interaction_id}"):
        yield frame
