"""The tool-call format for SmolLM2-135M-Instruct: the system prompt that describes the tools, and
a short supervised warm start on it.

SmolLM2's chat template renders no tools, so an agent describes them in its system message (as
SmolLM2's model card does), in the form its function-calling data used: a JSON list of calls in a
``<tool_call>`` block, which the SmolLM2 family's ``hermes`` parser turns into real tool calls::

    <tool_call>[{"name": "calculator", "arguments": {"expression": "347 * 582"}}]</tool_call>

Told so, the raw model wrote that block 0 times in 24 replies (the model card's own prompt, 8 greedy
and 16 at T=1: it computes in prose, wrongly). The warm start (:func:`tool_warm_start`) is a few
dozen SFT steps on synthetic conversations (system, question, the call, the tool's result, the
answer) rendered through the family's renderer and bridged as the gateway bridges a tool round, so
the tokens are the ones serving produces; loss on the two assistant replies only. Cached like the
tiny model's warm start (``demo/sft.py``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rlgate.chat.conversation import Message, ToolCall, ToolSpec
from rlgate.train.warm_start import conversation_sequence as train_conversation

__all__ = ["call_text", "conversation_sequence", "tool_system_prompt", "tool_warm_start"]


def tool_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The system message that tells SmolLM2 about ``tools`` (OpenAI ``{"type": "function", ...}``): one
    line per tool, ``name(param: type, ...): description`` (~60 tokens for the calculator, where the
    JSON schemas took ~130: every token of it is in every rollout and every training sequence)."""
    lines = []
    for t in tools:
        fn = t["function"]
        props = fn.get("parameters", {}).get("properties", {})
        params = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        lines.append(f"{fn['name']}({params}): {fn.get('description', '')}".rstrip(": "))
    return ("Tools:\n" + "\n".join(lines) + "\n"
            'To use a tool, reply with only <tool_call>[{"name": ..., "arguments": {...}}]</tool_call>. '
            "After its result, give the final answer.")


def call_text(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps([{'name': name, 'arguments': arguments}])}</tool_call>"


def answer_text(item: dict[str, Any]) -> str:
    return f"{item['expression']} = {item['answer']}"


def conversation_sequence(renderer: Any, item: dict[str, Any], stop_ids: list[int], system: str,
                          tool: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of system + question -> tool call -> tool result -> answer, as the
    gateway renders and bridges it (mask 1 on the assistant replies and their stop tokens)."""
    fn = tool["function"]
    args = json.dumps({"expression": item["expression"]})
    messages = [Message.of("system", system), Message.of("user", item["question"]),
                Message(role="assistant", tool_calls=[ToolCall("call_0", fn["name"], args)]),
                Message.of("tool", item["answer"], tool_call_id="call_0"), Message.of("assistant", answer_text(item))]
    return train_conversation(renderer, messages, [ToolSpec(fn["name"], fn.get("description"), fn["parameters"])],
                              stop_ids[0])


def tool_warm_start(base_model: Path, out: Path, items: list[dict[str, Any]], *, system: str, tool: dict[str, Any],
                    steps: int, seed: int, lr: float, batch_size: int, log: Any = print) -> dict[str, Any]:
    """``steps`` SFT steps on ``items`` (``{"question", "answer", "expression"}``) into ``out``
    (cached while the settings, the system prompt and the tool are the same)."""
    from rlgate.chat.families.registry import resolve_family
    from rlgate.demo.sft import warm_start

    def sequences(renderer: Any, stop_ids: list[int]) -> list[tuple[list[int], list[int]]]:
        tokenizer = renderer.tokenizer
        family = resolve_family(tokenizer, None, base_model)  # the gateway's renderer for this checkpoint
        served = family.renderer(tokenizer)
        stops = [*stop_ids, *(i for i in family.stop_token_ids(tokenizer) if i not in stop_ids)]
        return [conversation_sequence(served, it, stops, system, tool) for it in items]

    digest = hashlib.sha256(json.dumps([system, tool, str(base_model)]).encode()).hexdigest()[:16]
    return warm_start(base_model, out, items, task="tools-format", steps=steps, seed=seed, lr=lr,
                      batch_size=batch_size, log=log, sequences=sequences, cache_key={"format": digest})
