"""Llama 3.x JSON tool calls: the whole reply is ``{"name": ..., "parameters": {...}}``.

Optionally preceded by ``<|python_tag|>``; several calls may be separated by ``;``.
The decision is made on the first non-blank character: a reply that starts with
``{`` (or the python tag) is buffered to the end and parsed; if any part fails to
parse, the whole reply is returned verbatim as content. Anything else streams through
as content.
"""

from __future__ import annotations

import json

from rlgate.chat.parsers.base import (
    ContentText,
    ParsedToolCall,
    ToolEvent,
    ToolParser,
    register_tool_parser,
    tool_call_from_obj,
)

PYTHON_TAG = "<|python_tag|>"


@register_tool_parser("llama3_json", "llama3")
class Llama3JsonToolParser(ToolParser):
    markers = (PYTHON_TAG,)

    @classmethod
    def unparsed_blocks(cls, text: str) -> int:
        """A reply left as text that still looks like a call: the python tag, or a JSON object
        naming a function."""
        head = text.lstrip()
        if head.startswith(PYTHON_TAG) or PYTHON_TAG in text:
            return text.count(PYTHON_TAG)
        return int(head.startswith("{") and '"name"' in head)

    def __init__(self) -> None:
        self._buf = ""
        self._mode: str | None = None  # None: undecided, "json": buffering, "text": passthrough

    def feed(self, text: str) -> list[ToolEvent]:
        if self._mode == "text":
            return [ContentText(text)] if text else []
        self._buf += text
        if self._mode is None:
            head = self._buf.lstrip()
            if not head:
                return []
            if head.startswith("{") or head.startswith(PYTHON_TAG):
                self._mode = "json"
            elif PYTHON_TAG.startswith(head):
                return []  # could still become the python tag
            else:
                self._mode = "text"
                out, self._buf = self._buf, ""
                return [ContentText(out)]
        return []

    def finish(self) -> list[ToolEvent]:
        raw, self._buf = self._buf, ""
        if self._mode != "json":
            return [ContentText(raw)] if raw else []
        body = raw.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):]
        calls: list[ParsedToolCall] = []
        decoder = json.JSONDecoder()
        pos = 0
        body = body.strip()
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return [ContentText(raw)]
            call = tool_call_from_obj(obj)
            if call is None:
                return [ContentText(raw)]
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return list(calls) if calls else [ContentText(raw)]
