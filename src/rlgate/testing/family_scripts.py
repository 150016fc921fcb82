"""What each family's model writes for a reply (reasoning, answer, tool call), in its own format.

Used by tests/test_families.py and benchmarks/families.py to script the fake engine: the text is what
the real model would generate after the family's generation prompt, followed by the stop token
the real model ends that kind of reply with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# family -> (reasoning + answer, reasoning + tool call, tool call alone, answer alone); "{R}" reasoning,
# "{A}" answer, "{N}" tool name, "{J}" JSON arguments, "{a}"/"{b}" argument values, "{I}" the index of
# the call in the conversation (Kimi-K2 numbers its calls).
_QWEN_CALL = '<tool_call>\n{{"name": "{N}", "arguments": {J}}}\n</tool_call>'


@dataclass(frozen=True)
class Format:
    think_answer: str | None
    think_call: str | None
    call: str
    answer: str
    stop: str  # stop token after an answer
    call_stop: str  # stop token after a tool call
    reasoning: bool = True
    # Written by the model itself at the start of a reply that follows a tool result, where the
    # template adds no generation prompt there (DeepSeek-R1: the reasoning is not opened for it).
    after_tool: str = ""


FORMATS: dict[str, Format] = {
    "qwen3": Format("<think>\n{R}\n</think>\n\n{A}", "<think>\n{R}\n</think>\n\n" + _QWEN_CALL,
                    _QWEN_CALL, "{A}", "<|im_end|>", "<|im_end|>"),
    "qwen3_2507_thinking": Format("{R}\n</think>\n\n{A}", "{R}\n</think>\n\n" + _QWEN_CALL,
                                  "{R}\n</think>\n\n" + _QWEN_CALL, "{R}\n</think>\n\n{A}", "<|im_end|>", "<|im_end|>"),
    "qwen3_2507_instruct": Format(None, None, _QWEN_CALL, "{A}", "<|im_end|>", "<|im_end|>", reasoning=False),
    "qwen3_5": Format("{R}\n</think>\n\n{A}",
                      "{R}\n</think>\n\n<tool_call>\n<function={N}>\n<parameter=a>\n{a}\n</parameter>\n"
                      "<parameter=b>\n{b}\n</parameter>\n</function>\n</tool_call>",
                      "\n</think>\n\n<tool_call>\n<function={N}>\n<parameter=a>\n{a}\n</parameter>\n"
                      "<parameter=b>\n{b}\n</parameter>\n</function>\n</tool_call>",
                      "\n</think>\n\n{A}", "<|im_end|>", "<|im_end|>"),
    "deepseek_r1": Format("{R}\n</think>\n\n{A}",
                          "{R}\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{N}\n"
                          "```json\n{J}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                          "\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{N}\n"
                          "```json\n{J}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                          "\n</think>\n\n{A}", "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                          after_tool="<think>\n"),
    "llama3": Format(None, None, '{{"name": "{N}", "parameters": {J}}}', "{A}", "<|eot_id|>", "<|eot_id|>",
                     reasoning=False),
    "gpt_oss": Format("<|channel|>analysis<|message|>{R}<|end|><|start|>assistant<|channel|>final<|message|>{A}",
                      "<|channel|>analysis<|message|>{R}<|end|><|start|>assistant<|channel|>commentary "
                      "to=functions.{N} <|constrain|>json<|message|>{J}",
                      "<|channel|>commentary to=functions.{N} <|constrain|>json<|message|>{J}",
                      "<|channel|>final<|message|>{A}", "<|return|>", "<|call|>"),
    "glm45": Format("<think>{R}</think>\n{A}",
                    "<think>{R}</think>\n<tool_call>{N}\n<arg_key>a</arg_key>\n<arg_value>{a}</arg_value>\n"
                    "<arg_key>b</arg_key>\n<arg_value>{b}</arg_value>\n</tool_call>",
                    "<think></think>\n<tool_call>{N}\n<arg_key>a</arg_key>\n<arg_value>{a}</arg_value>\n"
                    "<arg_key>b</arg_key>\n<arg_value>{b}</arg_value>\n</tool_call>",
                    "<think></think>\n{A}", "<|user|>", "<|observation|>"),
    "kimi_k2": Format(None, None, "<|tool_calls_section_begin|><|tool_call_begin|>functions.{N}:{I}"
                      "<|tool_call_argument_begin|>{J}<|tool_call_end|><|tool_calls_section_end|>",
                      "{A}", "<|im_end|>", "<|im_end|>", reasoning=False),
}


def reply_text(family: str, kind: str, *, reasoning: str = "", answer: str = "", name: str = "add",
               args: dict[str, int] | None = None, index: int = 0, after_tool: bool = False) -> tuple[str, str]:
    """(text, stop token) of a reply of ``kind``: think_answer | think_call | call | answer;
    ``after_tool``: the reply follows a tool result."""
    f = FORMATS[family]
    if not f.reasoning:
        kind = {"think_answer": "answer", "think_call": "call"}.get(kind, kind)
    template = getattr(f, kind)
    args = args or {}
    text = template.format(R=reasoning, A=answer, N=name, J=json.dumps(args), a=args.get("a"), b=args.get("b"),
                           I=index)
    if after_tool:
        text = f.after_tool + text
    return text, (f.call_stop if kind.endswith("call") else f.stop)


def script_ids(tok: Any, family: str, turns: list[tuple[str, dict[str, Any]]]) -> list[list[int]]:
    """The fake engine's script for a conversation of ``turns`` ((kind, reply_text kwargs) each, a
    reply after a tool call answering the tool's result): token ids of each reply + its stop token."""
    out: list[list[int]] = []
    previous = ""
    for kind, kw in turns:
        text, stop = reply_text(family, kind, after_tool=previous.endswith("call"), **kw)
        out.append(list(tok.encode(text, add_special_tokens=False)) + [tok.convert_tokens_to_ids(stop)])
        previous = kind
    return out
