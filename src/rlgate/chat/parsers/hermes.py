"""Hermes / Qwen tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Repeatable; text around the calls is content. A call whose body is not a JSON object
with a ``name`` (or that is never closed) is returned verbatim as content.
"""

from __future__ import annotations

import json

from rlgate.chat.parsers.base import (
    ContentText,
    ToolEvent,
    ToolParser,
    partial_suffix_len,
    register_tool_parser,
    tool_call_from_obj,
)

START, END = "<tool_call>", "</tool_call>"


@register_tool_parser("hermes", "qwen", "qwen25")
class HermesToolParser(ToolParser):
    markers = (START,)

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        out: list[ToolEvent] = []
        while True:
            if not self._in_call:
                i = self._buf.find(START)
                if i < 0:
                    keep = partial_suffix_len(self._buf, START)
                    emit = self._buf[: len(self._buf) - keep]
                    if emit:
                        out.append(ContentText(emit))
                    self._buf = self._buf[len(emit):]
                    return out
                if i:
                    out.append(ContentText(self._buf[:i]))
                self._buf = self._buf[i + len(START):]
                self._in_call = True
            else:
                j = self._buf.find(END)
                if j < 0:
                    return out
                body, self._buf = self._buf[:j], self._buf[j + len(END):]
                self._in_call = False
                out.append(self._parse(body))

    def finish(self) -> list[ToolEvent]:
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            return [ContentText(START + rest)]
        return [ContentText(rest)] if rest else []

    @staticmethod
    def _parse(body: str) -> ToolEvent:
        try:
            call = tool_call_from_obj(json.loads(body))
        except json.JSONDecodeError:
            call = None
        return call if call is not None else ContentText(START + body + END)
