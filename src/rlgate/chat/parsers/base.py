"""Tool-call and reasoning parsers: incremental, one module per format, a registry.

A parser is fed the model's text piece by piece (as tokens are decoded) and returns
events. The same parser instance serves streaming and non-streaming requests, so both
produce the same result. A parser never loses text: anything it cannot parse is
returned verbatim as content (and the finish reason stays what it was).

Registry: ``@register_tool_parser("hermes", "qwen")`` makes a class available by
name; :func:`get_tool_parser` / :func:`get_reasoning_parser` build a fresh instance
per request.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar


@dataclass
class ContentText:
    text: str


@dataclass
class ReasoningText:
    text: str


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of the arguments object


ToolEvent = ContentText | ParsedToolCall
ReasoningEvent = ContentText | ReasoningText


class ToolParser(ABC):
    """Splits assistant content into text and tool calls, incrementally.

    ``markers``: strings that open a call in this format. A block the parser cannot parse
    stays in the reply text, so :meth:`unparsed_blocks` counting them in the final text
    counts the failures (the silent-failure guards in :mod:`rlgate.metrics` use it).
    ``schemas`` (tool name -> JSON schema of its parameters, set by :func:`get_tool_parser`)
    lets formats that write argument values as bare text (XML-style) type them.
    """

    markers: ClassVar[tuple[str, ...]] = ()
    schemas: Mapping[str, Mapping[str, Any]] = MappingProxyType({})

    @classmethod
    def unparsed_blocks(cls, text: str) -> int:
        """Calls in this format left unparsed in ``text`` (the visible reply)."""
        return sum(text.count(m) for m in cls.markers)

    @abstractmethod
    def feed(self, text: str) -> list[ToolEvent]: ...

    @abstractmethod
    def finish(self) -> list[ToolEvent]: ...


class ReasoningParser(ABC):
    """Splits generated text into reasoning and content, incrementally.

    Subclasses take ``starts_in_reasoning`` (the prompt already opened the reasoning block)."""

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        self.starts_in_reasoning = starts_in_reasoning

    @abstractmethod
    def feed(self, text: str) -> list[ReasoningEvent]: ...

    @abstractmethod
    def finish(self) -> list[ReasoningEvent]: ...


_TOOL_PARSERS: dict[str, type[ToolParser]] = {}
_REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}


def register_tool_parser(*names: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
    def deco(cls: type[ToolParser]) -> type[ToolParser]:
        for n in names:
            _TOOL_PARSERS[n] = cls
        return cls

    return deco


def register_reasoning_parser(*names: str) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    def deco(cls: type[ReasoningParser]) -> type[ReasoningParser]:
        for n in names:
            _REASONING_PARSERS[n] = cls
        return cls

    return deco


def tool_parser_names() -> list[str]:
    return sorted(_TOOL_PARSERS)


def reasoning_parser_names() -> list[str]:
    return sorted(_REASONING_PARSERS)


def get_tool_parser(name: str, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> ToolParser:
    """A fresh parser; ``schemas``: the offered tools' parameter schemas by tool name."""
    try:
        parser = _TOOL_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {tool_parser_names()}") from None
    if schemas:
        parser.schemas = MappingProxyType(dict(schemas))
    return parser


def unparsed_tool_blocks(text: str, parser: str | None = None) -> int:
    """Tool-call blocks left as text in ``text``: in ``parser``'s format, or (None) the markup of
    any registered parser (the most markers any one of them finds). Only the parser that runs
    applies its looser heuristics (Llama 3's bare ``{"name": ...}`` object): any JSON answer
    with a "name" key (a structured output) is no tool call of a model that does not use that
    format."""
    if not text:
        return 0
    if parser is not None:
        return _TOOL_PARSERS[parser].unparsed_blocks(text)
    return max((sum(text.count(m) for m in cls.markers) for cls in set(_TOOL_PARSERS.values())), default=0)


def get_reasoning_parser(name: str, *, starts_in_reasoning: bool = False) -> ReasoningParser:
    """A fresh parser; ``starts_in_reasoning``: the prompt already opened the reasoning block."""
    try:
        cls = _REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {reasoning_parser_names()}") from None
    return cls(starts_in_reasoning=starts_in_reasoning)


def partial_suffix_len(buf: str, marker: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``marker``."""
    for n in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-n:]):
            return n
    return 0


def tool_call_from_obj(obj: Any) -> ParsedToolCall | None:
    """``{"name": str, "arguments"|"parameters": object|json-string}`` -> call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
