"""Generated token ids -> what the client sees (text, reasoning, tool calls), incrementally.

One :class:`OutputAssembler` per request. Tokens are pushed one at a time as the engine
produces them; it returns events for the API surface to stream. Non-streaming requests
push the same tokens through the same assembler, so a streamed call and a
non-streamed call with the same tokens return the same message.

Pipeline per token::

    token id -> incremental detokenizer -> stop-string matcher
             -> reasoning parser (optional) -> tool parser (optional) -> trimming
             -> ReasoningDelta / ContentDelta / ToolCallDelta events

* The stop token that ended generation (one of the request's stop token ids) is
  recorded in the trajectory but never shown as text.
* Stop strings (OpenAI ``stop``, Anthropic ``stop_sequences``) are matched on the
  decoded text; text from the match on is not shown, and generation stops. The
  trajectory keeps the tokens up to and including the one that completed the match
  (:attr:`OutputAssembler.kept_tokens`).
* Content and reasoning are trimmed: leading blanks are dropped and trailing blanks
  are held back until more text follows, so the concatenation of the streamed deltas
  equals the non-streamed text.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlgate.chat.conversation import Message, TextPart, ToolCall
from rlgate.chat.parsers.base import (
    ContentText,
    ParsedToolCall,
    ReasoningParser,
    ReasoningText,
    ToolParser,
)
from rlgate.chat.token_text import decode


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallDelta:
    index: int  # position among this reply's tool calls
    id: str
    name: str
    arguments: str  # complete JSON text of the arguments


OutputEvent = ReasoningDelta | ContentDelta | ToolCallDelta


def join_text_deltas(events: list[OutputEvent]) -> list[OutputEvent]:
    """Adjacent content (or reasoning) deltas joined; every other event kept in place."""
    out: list[OutputEvent] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + ev.text)
        elif isinstance(ev, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + ev.text)
        else:
            out.append(ev)
    return out


def openai_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class IncrementalDetokenizer:
    """Decodes one token at a time, never splitting a multi-byte character.

    Uses the ``tokenizers`` library's streaming decoder when the tokenizer is a fast
    one (about 8x cheaper per token); otherwise re-decodes a sliding window.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        backend = getattr(tokenizer, "_tokenizer", None)
        self._fast = None
        if backend is not None:
            try:
                from tokenizers.decoders import DecodeStream

                self._fast = (DecodeStream(skip_special_tokens=False), backend)
            except ImportError:  # tokenizers < 0.21
                self._fast = None
        self._ids: list[int] = []
        self._prefix = 0  # start of the window whose text was already emitted
        self._read = 0  # end of that window
        self._shown = 0  # characters returned so far
        self._whole: str | None = None  # the text of push_all's ids (then only flush may follow)

    def _decode(self, ids: list[int]) -> str:
        return decode(self._tok, ids)

    def push_all(self, ids: list[int]) -> str:
        """Every token of a reply at once, on a fresh detokenizer: one decode instead of one step
        per token (the same text: ``flush`` relies on it too). An incomplete character at the
        end waits for ``flush``, as with ``push``; only ``flush`` may follow."""
        if self._ids:
            raise RuntimeError("push_all needs a fresh detokenizer")
        self._ids = list(ids)
        self._whole = self._decode(self._ids)
        self._shown = len(self._whole.rstrip("\ufffd"))
        return self._whole[:self._shown]

    def push(self, token_id: int) -> str:
        if self._whole is not None:
            raise RuntimeError("push after push_all")
        self._ids.append(token_id)
        if self._fast is not None:
            stream, backend = self._fast
            text = stream.step(backend, token_id) or ""
        else:
            text = ""
            before = self._decode(self._ids[self._prefix:self._read])
            after = self._decode(self._ids[self._prefix:])
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self._prefix, self._read = self._read, len(self._ids)
                text = after[len(before):]
        self._shown += len(text)
        return text

    def flush(self) -> str:
        """Text still held back at the very end (an incomplete character)."""
        full = self._whole if self._whole is not None else self._decode(self._ids)
        out = full[self._shown:]
        self._shown = len(full)
        return out


class _Trimmer:
    """Drops leading blanks; holds trailing blanks until non-blank text follows."""

    def __init__(self) -> None:
        self.started = False
        self.pending = ""

    def feed(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        text = self.pending + text
        stripped = text.rstrip()
        self.pending = text[len(stripped):]
        return stripped


class _StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit, matched stop string or None)."""
        if not self.stops:
            return text, None
        self.pending += text
        best: tuple[int, str] | None = None
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            out = self.pending[: best[0]]
            self.pending = ""
            return out, best[1]
        cut = max(0, len(self.pending) - self.hold)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, None

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass
class AssembledOutput:
    """The assistant reply as the client receives it."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_sequence: str | None = None  # the stop string that ended generation, if any

    def to_message(self) -> Message:
        return Message(
            role="assistant",
            content=[TextPart(self.content)] if self.content else [],
            tool_calls=list(self.tool_calls),
            reasoning=self.reasoning or None,
        )


class OutputAssembler:
    """See module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop_token_ids: tuple[int, ...] | list[int] = (),
        stop_strings: list[str] | None = None,
        tool_parser: ToolParser | None = None,
        reasoning_parser: ReasoningParser | None = None,
        call_id: Callable[[], str] = openai_call_id,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop_ids = set(stop_token_ids)
        self._stops = _StopMatcher(list(stop_strings or []))
        self._tools = tool_parser
        self._reasoning = reasoning_parser
        self._call_id = call_id
        self._content_trim = _Trimmer()
        self._reasoning_trim = _Trimmer()
        self.result = AssembledOutput()
        self.kept_tokens = 0  # how many pushed tokens belong to the recorded output
        self.stopped = False  # a stop string matched: the caller should stop generating

    # -------------------------------------------------------------- public

    def push(self, token_id: int) -> list[OutputEvent]:
        if self.stopped:
            return []
        self.kept_tokens += 1
        if token_id in self._stop_ids:
            return []  # the stop token itself is never shown
        text, matched = self._stops.feed(self._detok.push(token_id))
        events = self._route(text)
        if matched is not None:
            self.stopped = True
            self.result.stop_sequence = matched
            events += self._finish_parsers()
        return events

    def push_many(self, token_ids: Sequence[int]) -> list[OutputEvent]:
        """:meth:`push` for tokens that arrived together: the same text, in fewer events.

        Without stop strings the tokens are detokenised one by one and their text goes
        through the parsers at once; with stop strings every token is matched on its own
        (the match must know which token completed it).
        """
        if self._stops.stops:
            events: list[OutputEvent] = []
            for token_id in token_ids:
                events += self.push(token_id)
                if self.stopped:
                    break
            return join_text_deltas(events)
        if self.stopped:
            return []
        self.kept_tokens += len(token_ids)
        stop_ids, detok = self._stop_ids, self._detok
        return self._route("".join([detok.push(t) for t in token_ids if t not in stop_ids]))

    def push_all(self, token_ids: Sequence[int]) -> list[OutputEvent]:
        """The whole reply at once (a response sent in one piece): :meth:`push_many`, with the
        text decoded in one call when no stop string must be watched token by token. Only
        :meth:`finish` may follow."""
        if self._stops.stops or self.stopped or self.kept_tokens:
            return self.push_many(token_ids)
        self.kept_tokens += len(token_ids)
        stop_ids = self._stop_ids
        return self._route(self._detok.push_all([t for t in token_ids if t not in stop_ids]))

    def finish(self) -> list[OutputEvent]:
        if self.stopped:
            return []
        self.stopped = True
        text, matched = self._stops.feed(self._detok.flush())
        if matched is not None:
            self.result.stop_sequence = matched
        else:
            text += self._stops.flush()
        return self._route(text) + self._finish_parsers()

    # -------------------------------------------------------------- plumbing

    def _route(self, text: str) -> list[OutputEvent]:
        if not text:
            return []
        pieces = self._reasoning.feed(text) if self._reasoning else [ContentText(text)]
        return self._dispatch(pieces)

    def _finish_parsers(self) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        if self._reasoning:
            events += self._dispatch(self._reasoning.finish())
        if self._tools:
            events += self._dispatch_tool_events(self._tools.finish())
        return events

    def _dispatch(self, pieces: list[Any]) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        for p in pieces:
            if isinstance(p, ReasoningText):
                t = self._reasoning_trim.feed(p.text)
                if t:
                    self.result.reasoning += t
                    events.append(ReasoningDelta(t))
            elif isinstance(p, ParsedToolCall):  # formats whose one parser does both (harmony)
                events += self._dispatch_tool_events([p])
            elif self._tools:
                events += self._dispatch_tool_events(self._tools.feed(p.text))
            else:
                events += self._content(p.text)
        return events

    def _dispatch_tool_events(self, pieces: list[Any]) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        for p in pieces:
            if isinstance(p, ParsedToolCall):
                call = ToolCall(self._call_id(), p.name, p.arguments)
                self.result.tool_calls.append(call)
                events.append(ToolCallDelta(len(self.result.tool_calls) - 1, call.id, call.name, call.arguments))
            else:
                events += self._content(p.text)
        return events

    def _content(self, text: str) -> list[OutputEvent]:
        t = self._content_trim.feed(text)
        if not t:
            return []
        self.result.content += t
        return [ContentDelta(t)]
