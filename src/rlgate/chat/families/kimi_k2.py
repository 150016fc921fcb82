"""Kimi-K2 Instruct: ``<|im_user|>…<|im_middle|>…<|im_end|>`` turns, sectioned tool calls.

A tool call is ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{…}<|tool_call_end|><|tool_calls_section_end|>``, where IDX counts
the tool calls of the conversation from 0; the template writes a call's id verbatim and the
result as ``## Return of ID``. Whatever ids a client uses (``call_…``, Anthropic's ``toolu_…``),
rlgate renders them the way the model writes them: in a fresh rendering every call becomes
``functions.NAME:IDX`` (and its result follows), and a bridged tool result carries the id the
parent reply really contains. Renderer: ``renderers`` ``kimi-k2``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from rlgate.chat.conversation import Message
from rlgate.chat.families.base import CheckpointInfo, ModelFamily, ParentTurn
from rlgate.chat.families.renderers_backend import renderers_backend
from rlgate.chat.token_text import decode

# The id the model wrote after each <|tool_call_begin|> of a reply.
_WRITTEN_ID = re.compile(r"<\|tool_call_begin\|>\s*(functions\.[^:<\s]+:\d+)")


def detect(info: CheckpointInfo) -> bool:
    return ("<|im_middle|>" in info.chat_template and "<|im_user|>" in info.chat_template
            and info.has_tokens("<|tool_calls_section_begin|>", "<|tool_call_argument_begin|>"))


def kimi_call_ids(messages: list[Message], parent: ParentTurn | None, tokenizer: Any) -> list[Message]:
    """``messages`` with tool-call ids as Kimi-K2 writes them (see module docstring).

    ``parent`` (bridges): the ids the parent reply's tokens contain, paired with the reply's
    calls by position, name the results in ``messages``; calls in ``messages`` continue the count.
    """
    ids: dict[str, str] = {}
    count = 0
    if parent is not None:
        written = _WRITTEN_ID.findall(decode(tokenizer, parent.output_ids))
        for tc, wid in zip(parent.reply.tool_calls, written, strict=False):
            ids[tc.id] = wid
        count = 1 + max((int(w.rsplit(":", 1)[1]) for w in written), default=-1)
    out: list[Message] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for tc in m.tool_calls:
                ids[tc.id] = f"functions.{tc.name}:{count}"
                count += 1
                calls.append(replace(tc, id=ids[tc.id]))
            m = replace(m, tool_calls=calls)
        elif m.role == "tool" and m.tool_call_id in ids:
            m = replace(m, tool_call_id=ids[m.tool_call_id])
        out.append(m)
    return out


FAMILY = ModelFamily(
    name="kimi_k2",
    title="Kimi-K2",
    detect=detect,
    build_renderer=renderers_backend("kimi-k2", prepare=kimi_call_ids),
    tool_parser="kimi_k2",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>",),
    history="keeps history verbatim",
)
