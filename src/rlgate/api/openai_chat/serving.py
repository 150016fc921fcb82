"""Chat Completions: wire request -> ChatRequest -> generation -> ChatCompletion / chunks."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from rlgate.api.common import extra_fields, sse, tool_spec
from rlgate.api.keepalive import KeepAlive, with_keepalive
from rlgate.api.normalize import Sampling, chat_request, openai_tool_choice
from rlgate.api.openai_chat.protocol import IGNORED_PARAMS, ChatCompletionRequest, ChatMessageParam
from rlgate.api.streaming import guard_stream
from rlgate.chat.conversation import ContentPart, ImagePart, Message, TextPart, ToolCall
from rlgate.chat.output import ContentDelta, ReasoningDelta, ToolCallDelta
from rlgate.core.generation import Finished, GenerationService, Prepared
from rlgate.core.request import ChatRequest
from rlgate.errors import InvalidRequest
from rlgate.surfaces import CHAT

ID_PREFIX = "chatcmpl-"


# --------------------------------------------------------------------------- request


def parse_image_url(url: str) -> ImagePart:
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return ImagePart(data=data, media_type=media)
    return ImagePart(url=url)  # kept as a reference; never fetched


def convert_message(m: ChatMessageParam, index: int) -> Message:
    role = "system" if m.role == "developer" else m.role
    parts: list[ContentPart] = []
    if isinstance(m.content, str):
        if m.content:
            parts.append(TextPart(m.content))
    elif m.content is not None:
        for p in m.content:
            if p.type == "text":
                parts.append(TextPart(p.text))
            else:
                parts.append(parse_image_url(p.image_url.url))
    calls: list[ToolCall] = []
    for tc in m.tool_calls or []:
        if role != "assistant":
            raise InvalidRequest("only assistant messages may carry tool_calls", param=f"messages[{index}].tool_calls")
        args = tc.function.arguments
        calls.append(ToolCall(tc.id, tc.function.name, args if isinstance(args, str) else json.dumps(args)))
    return Message(
        role=role,
        content=parts,
        tool_calls=calls,
        tool_call_id=m.tool_call_id if role == "tool" else None,
        name=m.name if role == "tool" else None,
        reasoning=m.reasoning_content if role == "assistant" else None,
    )


def to_chat_request(body: ChatCompletionRequest) -> ChatRequest:
    if body.n not in (None, 1):
        raise InvalidRequest("only n=1 is supported", param="n")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise InvalidRequest("set max_tokens or max_completion_tokens, not both", param="max_tokens")
    tools = [
        tool_spec(t.function.name, t.function.description, t.function.parameters, f"tools[{i}].function.parameters")
        for i, t in enumerate(body.tools or [])
    ]
    sampling = Sampling(
        max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
        max_total_tokens=body.max_total_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=[body.stop] if isinstance(body.stop, str) else body.stop,  # counted in core/limits.py
        store=body.store,
    )
    return chat_request([convert_message(m, i) for i, m in enumerate(body.messages)], tools,
                        openai_tool_choice(body.tool_choice, nested=True), sampling,
                        template_kwargs=body.chat_template_kwargs, tool_choice_param="tool_choice.function",
                        tool_name_param="tools[{i}].function.name")


def ignored_params(body: ChatCompletionRequest) -> list[str]:
    names = [n for n in IGNORED_PARAMS if getattr(body, n) is not None]
    if any(t.function.strict for t in body.tools or []):
        names.append("tools.function.strict")  # arguments are not constrained to the schema
    for t in body.tools or []:
        names += [f"tools.function.{n}" for n in extra_fields(t.function)]
    return sorted(set(names + extra_fields(body)))


# --------------------------------------------------------------------------- response


def tool_calls_json(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def usage(f: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    }


def completion_json(f: Finished, model: str, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": f.content or None, "refusal": None}
    if f.tool_calls:
        message["tool_calls"] = tool_calls_json(f.tool_calls)
    if f.reasoning:
        message["reasoning_content"] = f.reasoning
    return {
        "id": f.interaction_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": f.finish_reason, "logprobs": None}],
        "usage": usage(f),
    }


async def complete(service: GenerationService, prepared: Prepared, model: str) -> dict[str, Any]:
    created = int(time.time())
    return completion_json(await service.complete(prepared), model, created)


async def stream_chunks(
    service: GenerationService, prepared: Prepared, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE frames: role chunk, deltas, one finish chunk, optional usage chunk, [DONE]; after
    a failure, one ``data: {"error": ...}`` frame ends the stream (api/streaming.py)."""
    created = int(time.time())
    base = {"id": prepared.interaction_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    async def frames() -> AsyncGenerator[bytes, None]:
        yield chunk({"role": "assistant", "content": ""})
        async for ev in with_keepalive(service.run(prepared), service.config.stream_keepalive_interval):
            if isinstance(ev, KeepAlive):
                yield b": keepalive\n\n"  # an SSE comment: keeps the connection alive, ignored by parsers
            elif isinstance(ev, ContentDelta):
                yield chunk({"content": ev.text})
            elif isinstance(ev, ReasoningDelta):
                yield chunk({"reasoning_content": ev.text})
            elif isinstance(ev, ToolCallDelta):
                yield chunk({"tool_calls": [{
                    "index": ev.index, "id": ev.id, "type": "function",
                    "function": {"name": ev.name, "arguments": ev.arguments},
                }]})
            elif isinstance(ev, Finished):
                if include_usage:
                    yield chunk({}, ev.finish_reason)
                    yield sse({**base, "choices": [], "usage": usage(ev)})
                else:
                    yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": ev.finish_reason,
                                                    "logprobs": None}], "usage": usage(ev)})
        yield b"data: [DONE]\n\n"

    async for frame in guard_stream(frames(), CHAT.stream_error_frames, label=f"chat stream {prepared.interaction_id}"):
        yield frame
