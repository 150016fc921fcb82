"""Responses API serving: a generation as one Response object or as SSE events.

:class:`ItemBuilder` turns the generation's output events into output items and the
stream events that build them, the way Anthropic's ``BlockBuilder`` builds content
blocks. Streaming emits the same items as a JSON answer, in the same order (function-call
items once the text is complete), so a streamed and a non-streamed response are equal.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from rlgate.api.keepalive import KeepAlive, with_keepalive
from rlgate.api.openai_responses.objects import (
    ItemIds,
    ResponseContext,
    final_response,
    message_item,
    new_id,
    output_items,
    output_text_part,
    reasoning_item,
    response_json,
)
from rlgate.api.openai_responses.tools import ResponseTools, call_item
from rlgate.api.streaming import guard_stream
from rlgate.chat.output import ContentDelta, OutputEvent, ReasoningDelta, ToolCallDelta, openai_call_id
from rlgate.core.generation import Finished, GenerationService, Prepared
from rlgate.errors import GatewayError
from rlgate.surfaces import RESPONSES, ResponsesStream

__all__ = ["ID_PREFIX", "ItemBuilder", "complete", "new_call_id", "stream_events"]

log = logging.getLogger("rlgate.api.responses")

ID_PREFIX = "resp_"

Event = tuple[str, dict[str, Any]]  # (event type, its fields without the sequence number)


def new_call_id() -> str:
    """``call_…``: the ``call_id`` of a generated function call."""
    return openai_call_id()


class ItemBuilder:
    """Output events -> output items, plus the stream events that build them.

    Items get output indices in the order they open: reasoning, then the message, then
    function calls (announced once the text is complete, see the module docstring).
    """

    def __init__(self, tools: ResponseTools, ids: ItemIds | None = None) -> None:
        self.tools = tools
        self.ids = ids if ids is not None else ItemIds()
        self.done: list[dict[str, Any]] = []  # output items finished so far (for response.failed)
        self.reasoning = ""
        self.content = ""
        self.calls: list[ToolCallDelta] = []
        self._next_index = 0
        self._reasoning_index: int | None = None  # output index of the open reasoning item
        self._reasoning_closed = False
        self._message_index: int | None = None  # output index of the message item

    def _open(self) -> int:
        index, self._next_index = self._next_index, self._next_index + 1
        return index

    def feed(self, ev: OutputEvent) -> list[Event]:
        if isinstance(ev, ReasoningDelta):
            return self._reasoning_delta(ev.text)
        if isinstance(ev, ContentDelta):
            return self._close_reasoning("completed") + self._content_delta(ev.text)
        if isinstance(ev, ToolCallDelta):
            self.calls.append(ev)  # announced once the text is complete
            return self._close_reasoning("completed")
        return []

    def _reasoning_delta(self, text: str) -> list[Event]:
        self.reasoning += text
        if self._reasoning_closed:  # cannot happen with the registered parsers (reasoning comes first)
            return []
        events: list[Event] = []
        rid = self.ids.reasoning
        if self._reasoning_index is None:
            self._reasoning_index = self._open()
            events += [
                ("response.output_item.added", {"output_index": self._reasoning_index,
                                                "item": {**reasoning_item(rid, "", "in_progress"), "content": []}}),
                ("response.content_part.added", {"item_id": rid, "output_index": self._reasoning_index,
                                                 "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}),
            ]
        events.append(("response.reasoning_text.delta", {"item_id": rid, "output_index": self._reasoning_index,
                                                         "content_index": 0, "delta": text}))
        return events

    def _close_reasoning(self, status: str) -> list[Event]:
        index, self._reasoning_index, self._reasoning_closed = self._reasoning_index, None, True
        if index is None:
            return []
        item = reasoning_item(self.ids.reasoning, self.reasoning, status)
        self.done.append(item)
        where = {"item_id": self.ids.reasoning, "output_index": index, "content_index": 0}
        return [
            ("response.reasoning_text.done", {**where, "text": self.reasoning}),
            ("response.content_part.done", {**where, "part": {"type": "reasoning_text", "text": self.reasoning}}),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]

    def _content_delta(self, text: str) -> list[Event]:
        self.content += text
        events: list[Event] = []
        mid = self.ids.message
        if self._message_index is None:
            self._message_index = self._open()
            events += [
                ("response.output_item.added", {"output_index": self._message_index,
                                                "item": message_item(mid, None, "in_progress")}),
                ("response.content_part.added", {"item_id": mid, "output_index": self._message_index,
                                                 "content_index": 0, "part": output_text_part("")}),
            ]
        events.append(("response.output_text.delta", {"item_id": mid, "output_index": self._message_index,
                                                      "content_index": 0, "delta": text, "logprobs": []}))
        return events

    def finish(self, finish_reason: str) -> list[Event]:
        """Close every item: the reasoning, the message, then one function call item per call."""
        cut = finish_reason in ("length", "abort")
        events = self._close_reasoning("incomplete" if cut and not self.content and not self.calls else "completed")
        if self._message_index is not None:
            item = message_item(self.ids.message, self.content, "incomplete" if cut else "completed")
            self.done.append(item)
            where = {"item_id": self.ids.message, "output_index": self._message_index, "content_index": 0}
            events += [
                ("response.output_text.done", {**where, "text": self.content, "logprobs": []}),
                ("response.content_part.done", {**where, "part": output_text_part(self.content)}),
                ("response.output_item.done", {"output_index": self._message_index, "item": item}),
            ]
        for i, call in enumerate(self.calls):
            index, item_id = self._open(), self.ids.call(i)
            item = call_item(self.tools, item_id, call, "completed")  # function / custom / local shell call
            self.done.append(item)
            where = {"item_id": item_id, "output_index": index}
            events.append(("response.output_item.added", {
                "output_index": index, "item": call_item(self.tools, item_id, call, "in_progress", complete=False)}))
            if item["type"] == "function_call":
                events += [("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                           ("response.function_call_arguments.done", {**where, "arguments": item["arguments"]})]
            elif item["type"] == "custom_tool_call":
                events += [("response.custom_tool_call_input.delta", {**where, "delta": item["input"]}),
                           ("response.custom_tool_call_input.done", {**where, "input": item["input"]})]
            events.append(("response.output_item.done", {"output_index": index, "item": item}))
        return events

    def items(self, finish_reason: str) -> list[dict[str, Any]]:
        """The response's output items (as :func:`~.objects.output_items` builds them)."""
        return output_items(self.reasoning, self.content, self.calls, finish_reason, self.ids, self.tools)


async def complete(service: GenerationService, prepared: Prepared, ctx: ResponseContext) -> dict[str, Any]:
    f = await service.complete(prepared)
    return final_response(service, ctx, f, output_items(f.reasoning, f.content, f.tool_calls, f.finish_reason,
                                                        ItemIds.of(f.interaction_id), ctx.tools))


async def failed_stream(ctx: ResponseContext, exc: GatewayError) -> AsyncIterator[bytes]:
    """A stream that fails before generating: what a streamed request gets for a prompt that does
    not fit. Codex reads ``response.failed`` with ``error.code == "context_length_exceeded"`` as
    "context window exceeded" (and compacts); a 400 before the stream would be a fatal error to it."""
    st = ResponsesStream(response_json(ctx, new_id(ID_PREFIX), status="in_progress", output=[]))
    yield st.event("response.created", {"response": st.response})
    yield st.event("response.in_progress", {"response": st.response})
    for frame in RESPONSES.stream_error_frames(exc, st):
        yield frame


async def stream_events(service: GenerationService, prepared: Prepared, ctx: ResponseContext
                        ) -> AsyncIterator[bytes]:
    """SSE events, in the Responses API's order (see docs/openai-responses.md); after a
    failure, an ``error`` and a ``response.failed`` event end the stream (api/streaming.py,
    frames from ``rlgate.surfaces``, which the cluster router uses too)."""
    rid = prepared.interaction_id
    builder = ItemBuilder(ctx.tools, ItemIds.of(rid))
    st = ResponsesStream(response_json(ctx, rid, status="in_progress", output=[]), output=builder.done)
    event = st.event

    async def frames() -> AsyncGenerator[bytes, None]:
        start = st.response
        yield event("response.created", {"response": start})
        yield event("response.in_progress", {"response": start})
        async for ev in with_keepalive(service.run(prepared), service.config.stream_keepalive_interval):
            if isinstance(ev, KeepAlive):  # the Responses API has no ping event: repeat the lifecycle event
                yield event("response.in_progress", {"response": start})
            elif isinstance(ev, Finished):
                for kind, fields in builder.finish(ev.finish_reason):
                    yield event(kind, fields)
                final = final_response(service, ctx, ev, builder.items(ev.finish_reason))
                kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
                yield event(kind, {"response": final})
            else:
                for kind, fields in builder.feed(ev):
                    yield event(kind, fields)

    def error_frames(exc: GatewayError) -> list[bytes]:
        return RESPONSES.stream_error_frames(exc, st)

    async for frame in guard_stream(frames(), error_frames, label=f"responses stream {rid}"):
        yield frame
