"""Tool calls written as delimited blocks: ``START body END`` (repeatable), text around them is content.

The machinery shared by the block formats (Hermes JSON, Qwen3.5 XML, GLM-4.5, Kimi-K2, DeepSeek-V3):
a subclass names its delimiters and turns a block's body into calls. A block whose body does not
parse, or that is never closed, is returned verbatim as content — a parser never loses text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rlgate.chat.parsers.base import ContentText, ParsedToolCall, ToolEvent, ToolParser, partial_suffix_len


class BlockToolParser(ToolParser):
    START = ""
    END = ""

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        """The calls in one block's body, or None if it is not well formed."""
        raise NotImplementedError

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        out: list[ToolEvent] = []
        while True:
            if not self._in_call:
                i = self._buf.find(self.START)
                if i < 0:
                    keep = partial_suffix_len(self._buf, self.START)
                    emit = self._buf[: len(self._buf) - keep]
                    if emit:
                        out.append(ContentText(emit))
                    self._buf = self._buf[len(emit):]
                    return out
                if i:
                    out.append(ContentText(self._buf[:i]))
                self._buf = self._buf[i + len(self.START):]
                self._in_call = True
            else:
                j = self._buf.find(self.END)
                if j < 0:
                    return out
                body, self._buf = self._buf[:j], self._buf[j + len(self.END):]
                self._in_call = False
                calls = self.parse_body(body)
                out.extend(calls if calls else [ContentText(self.START + body + self.END)])

    def finish(self) -> list[ToolEvent]:
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            return [ContentText(self.START + rest)]
        return [ContentText(rest)] if rest else []


class RegexBlockToolParser(BlockToolParser):
    """A block holding one or more calls, each matched by ``CALL``: group 1 the tool's name, group 2
    its JSON arguments (DeepSeek-V3, Kimi-K2). Anything else in the body makes the block content."""

    CALL: re.Pattern[str]

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        calls: list[ParsedToolCall] = []
        pos = 0
        while pos < len(body):
            m = self.CALL.match(body, pos)
            if m is None:
                return None
            try:
                c = call(m.group(1).strip(), json.loads(m.group(2)))
            except json.JSONDecodeError:
                return None
            if c is None:
                return None
            calls.append(c)
            pos = m.end()
        return calls or None


def value_from_text(raw: str) -> Any:
    """An XML-style argument value: JSON if it parses as JSON, else the text itself."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        return raw


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),),
    "object": (dict,), "array": (list,),
}


def _matches(value: Any, t: str) -> bool:
    if isinstance(value, bool) and t in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES.get(t, ()))


def typed_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """An XML-style argument value typed by the parameter's JSON schema.

    The model writes every value as bare text, so ``123`` may be a number or the string
    "123": the schema decides. A string parameter keeps the text; other types take the
    JSON reading of the text when it has one of the allowed types, else the text itself
    (the tool sees what the model wrote). Without a schema (or without ``type``) the JSON
    reading wins when there is one.
    """
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    types = [declared] if isinstance(declared, str) else [t for t in declared or [] if isinstance(t, str)]
    if not types:
        return value_from_text(raw)
    value = value_from_text(raw)
    if any(_matches(value, t) for t in types if t != "string"):
        return value
    return raw


def parameter_schema(schemas: Mapping[str, Mapping[str, Any]], tool: str, key: str) -> Mapping[str, Any] | None:
    """The JSON schema of parameter ``key`` of ``tool`` (None if unknown)."""
    props = (schemas.get(tool) or {}).get("properties")
    prop = props.get(key) if isinstance(props, Mapping) else None
    return prop if isinstance(prop, Mapping) else None


def call(name: str, args: Any) -> ParsedToolCall | None:
    if not name or not isinstance(args, dict):
        return None
    return ParsedToolCall(name, json.dumps(args, ensure_ascii=False))
