"""``<think>…</think>`` reasoning split (DeepSeek-R1 / Qwen3 style).

Reasoning is recognised only at the start of the reply (leading blanks allowed). A
reply that never closes its ``</think>`` (e.g. cut off by max_tokens) is all
reasoning. With ``starts_in_reasoning`` (the generation prompt already opened the block, as
Qwen3-Thinking-2507 and DeepSeek-R1 templates do) the reply is reasoning up to ``</think>``;
a redundant leading ``<think>`` is skipped.
"""

from __future__ import annotations

from rlgate.chat.parsers.base import (
    ContentText,
    ReasoningEvent,
    ReasoningParser,
    ReasoningText,
    partial_suffix_len,
    register_reasoning_parser,
)

START, END = "<think>", "</think>"


@register_reasoning_parser("think", "deepseek_r1", "qwen3")
class ThinkReasoningParser(ReasoningParser):
    def __init__(self, starts_in_reasoning: bool = False) -> None:
        super().__init__(starts_in_reasoning)
        self._buf = ""
        self._mode = "reasoning" if starts_in_reasoning else "detect"  # detect | reasoning | content
        self._opened = not starts_in_reasoning  # a redundant leading <think> is still to be skipped

    def feed(self, text: str) -> list[ReasoningEvent]:
        if self._mode == "content":
            return [ContentText(text)] if text else []
        self._buf += text
        out: list[ReasoningEvent] = []
        if not self._opened:
            head = self._buf.lstrip()
            if not head or (START.startswith(head) and head != START):
                return []  # could still be a redundant <think>
            self._opened = True
            if head.startswith(START):
                self._buf = head[len(START):]
        if self._mode == "detect":
            head = self._buf.lstrip()
            if head.startswith(START):
                self._buf = head[len(START):]
                self._mode = "reasoning"
            elif head and not START.startswith(head):
                self._mode = "content"
                rest, self._buf = self._buf, ""
                return [ContentText(rest)]
            else:
                return []
        j = self._buf.find(END)
        if j >= 0:
            if j:
                out.append(ReasoningText(self._buf[:j]))
            rest = self._buf[j + len(END):]
            self._buf = ""
            self._mode = "content"
            if rest:
                out.append(ContentText(rest))
            return out
        keep = partial_suffix_len(self._buf, END)
        emit = self._buf[: len(self._buf) - keep]
        if emit:
            out.append(ReasoningText(emit))
        self._buf = self._buf[len(emit):]
        return out

    def finish(self) -> list[ReasoningEvent]:
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        return [ReasoningText(rest)] if self._mode == "reasoning" else [ContentText(rest)]
