"""gpt-oss harmony replies: ``analysis`` -> reasoning, ``final`` -> content, calls -> tool calls.

The prompt ends with ``<|start|>assistant``; the reply is a sequence of messages::

    <|channel|>analysis<|message|>…<|end|>
    <|start|>assistant<|channel|>final<|message|>…                          (then <|return|>)
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}  (then <|call|>)

(the recipient may also sit before the channel: ``<|start|>assistant to=functions.NAME<|channel|>…``).
The stop tokens ``<|return|>`` / ``<|call|>`` are never shown as text, so a message ends at
``<|end|>`` or at the end of the reply. This one parser produces reasoning, content and tool
calls (the assembler accepts tool calls from a reasoning parser). Text outside any header is
content, so a reply that ignores the format loses nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlgate.chat.parsers.base import (
    ContentText,
    ParsedToolCall,
    ReasoningParser,
    ReasoningText,
    partial_suffix_len,
    register_reasoning_parser,
)

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
_RECIPIENT = re.compile(r"to=(?:functions\.)?([^\s<]+)")


@register_reasoning_parser("harmony", "gpt_oss")
class HarmonyParser(ReasoningParser):
    def __init__(self, starts_in_reasoning: bool = False) -> None:
        super().__init__(starts_in_reasoning)
        self._buf = ""
        self._header: str | None = ""  # header text of the current message; None: inside its body
        self._channel = ""
        self._recipient: str | None = None
        self._body = ""  # tool-call arguments being collected

    def feed(self, text: str) -> list[Any]:
        self._buf += text
        out: list[Any] = []
        while self._buf:
            if self._header is not None:  # reading a header, up to <|message|>
                i = self._buf.find(MESSAGE)
                if i < 0:
                    return out
                self._header += self._buf[:i]
                self._buf = self._buf[i + len(MESSAGE):]
                self._open(self._header)
                self._header = None
                continue
            j = self._buf.find(END)
            k = self._buf.find(START)
            cut = min(x for x in (j, k) if x >= 0) if (j >= 0 or k >= 0) else -1
            if cut < 0:
                keep = max(partial_suffix_len(self._buf, END), partial_suffix_len(self._buf, START))
                emit, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                out += self._body_text(emit)
                return out
            out += self._body_text(self._buf[:cut])
            out += self._close()
            marker = END if cut == j else START
            self._buf = self._buf[cut + len(marker):]
            if marker == END and self._buf.startswith(START):
                self._buf = self._buf[len(START):]
            self._header = ""
        return out

    def finish(self) -> list[Any]:
        out: list[Any] = []
        rest, self._buf = self._buf, ""
        if self._header is not None:
            if self._header or rest:  # a header never completed: keep its text as content
                out.append(ContentText(self._header + rest))
            self._header = None
            return out
        out += self._body_text(rest)
        out += self._close()
        return out

    # ------------------------------------------------------------------ messages

    def _open(self, header: str) -> None:
        h = header.replace("assistant", " ", 1) if header.lstrip().startswith("assistant") else header
        self._channel = ""
        if CHANNEL in h:
            self._channel = h.split(CHANNEL, 1)[1].split()[0] if h.split(CHANNEL, 1)[1].split() else ""
        m = _RECIPIENT.search(h)
        self._recipient = m.group(1) if m else None
        self._body = ""

    def _body_text(self, text: str) -> list[Any]:
        if not text:
            return []
        if self._recipient is not None:
            self._body += text
            return []
        if self._channel == "analysis":
            return [ReasoningText(text)]
        return [ContentText(text)]

    def _close(self) -> list[Any]:
        if self._recipient is None:
            return []
        name, body = self._recipient, self._body
        self._recipient, self._body = None, ""
        try:
            args = json.loads(body) if body.strip() else {}
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return [ContentText(body)]
        return [ParsedToolCall(name, json.dumps(args, ensure_ascii=False))]
