"""Supervised warm start: teach the tiny model the task's format, stop while it is mediocre.

Training sequences are built with the gateway's own renderer, so the model learns exactly
the token layout it will see when agents talk to it through rlgate (for the tools task:
prompt, tool call, the bridge carrying the tool result, final answer — loss only on the
assistant's tokens). The result is cached: ``warm_start`` returns at once when ``out``
already holds a checkpoint made with the same settings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlgate.chat.conversation import Message, ToolCall, ToolSpec
from rlgate.chat.families.base import ParentTurn
from rlgate.chat.render import ChatRenderer
from rlgate.train.warm_start import save_checkpoint, sft


def math_sequence(renderer: ChatRenderer, item: dict[str, Any], stop_id: int) -> tuple[list[int], list[int]]:
    prompt = renderer.render_ids([Message.of("user", item["question"])])
    out = renderer.encode(item["answer"]) + [stop_id]
    return prompt + out, [0] * len(prompt) + [1] * len(out)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def tools_sequence(renderer: ChatRenderer, item: dict[str, Any], stop_id: int, tool: dict[str, Any]
                   ) -> tuple[list[int], list[int]]:
    fn = tool["function"]
    tools = [ToolSpec(fn["name"], fn.get("description"), fn["parameters"])]
    prompt = renderer.render_ids([Message.of("user", item["question"])], tools)
    args = {"expression": item["expression"]}
    out1 = renderer.encode(tool_call_text(fn["name"], args)) + [stop_id]
    reply = Message(role="assistant", tool_calls=[ToolCall("call_0", fn["name"], json.dumps(args))])
    parent = ParentTurn(prompt, out1, reply, renderer.decode([stop_id]))
    bridge = renderer.bridge_ids(parent=parent, leading_system=None,
                                 new_messages=[Message.of("tool", item["answer"], tool_call_id="call_0")],
                                 tools=tools)
    out2 = renderer.encode(item["answer"]) + [stop_id]
    ids = prompt + out1 + bridge + out2
    mask = [0] * len(prompt) + [1] * len(out1) + [0] * len(bridge) + [1] * len(out2)
    return ids, mask


def greedy_texts(model: Any, renderer: ChatRenderer, prompts: list[list[int]], stop_ids: list[int],
                 max_new_tokens: int = 6, batch_size: int = 64) -> list[str]:
    """Greedy continuations of token-id prompts (left-padded batches), stop tokens removed."""
    import torch

    texts: list[str] = []
    was_training = model.training
    model.eval()
    for b in range(0, len(prompts), batch_size):
        chunk = prompts[b:b + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(chunk):  # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            att[i, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(ids, attention_mask=att, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=0, eos_token_id=stop_ids)
        texts += [renderer.tokenizer.decode([t for t in out[i, width:].tolist() if t not in stop_ids],
                                            skip_special_tokens=True) for i in range(len(chunk))]
    model.train(was_training)
    return texts


def greedy_accuracy(model: Any, renderer: ChatRenderer, items: list[dict[str, Any]], stop_ids: list[int]) -> float:
    """Single-turn greedy accuracy (last number of the reply == answer), batched."""
    from rlgate.demo.math_agent import math_reward

    prompts = [renderer.render_ids([Message.of("user", it["question"])]) for it in items]
    texts = greedy_texts(model, renderer, prompts, stop_ids, batch_size=len(prompts))
    return sum(math_reward(t, it["answer"]) for t, it in zip(texts, items, strict=False)) / len(items)


def tools_greedy_accuracy(model: Any, renderer: ChatRenderer, items: list[dict[str, Any]], stop_ids: list[int],
                          tool: dict[str, Any]) -> float:
    """Greedy accuracy of both steps of the tool task, each teacher-forced: the first reply
    calls the tool with the right expression, and the answer after the (true) tool result
    is right. An item counts when both are."""
    from rlgate.demo.math_agent import math_reward

    fn = tool["function"]
    tools = [ToolSpec(fn["name"], fn.get("description"), fn["parameters"])]
    first = [renderer.render_ids([Message.of("user", it["question"])], tools) for it in items]
    calls = greedy_texts(model, renderer, first, stop_ids, max_new_tokens=40)
    second = []
    for it in items:
        ids, mask = tools_sequence(renderer, it, stop_ids[0], tool)
        last_start = len(mask) - mask[::-1].index(0)  # the answer span starts after the last untrained token
        second.append(ids[:last_start])
    answers = greedy_texts(model, renderer, second, stop_ids)
    ok = [json.dumps(it["expression"]) in call and bool(math_reward(ans, it["answer"]))
          for it, call, ans in zip(items, calls, answers, strict=False)]
    return sum(ok) / len(items)


def warm_start(
    base_model: Path,
    out: Path,
    items: list[dict[str, Any]],
    *,
    task: str,
    steps: int,
    seed: int,
    lr: float = 1e-3,
    batch_size: int = 64,
    tool: dict[str, Any] | None = None,
    target_accuracy: float | None = None,
    validation: list[dict[str, Any]] | None = None,
    check_every: int = 10,
    min_steps: int = 40,
    log: Any = print,
    sequences: Any = None,
    cache_key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``base_model`` on ``items`` into ``out`` (cached).

    Runs ``steps`` steps, or — with ``target_accuracy`` and ``validation`` items — stops
    at the first check (every ``check_every`` steps, from
    ``min_steps``) where greedy accuracy on ``validation`` reaches the target: the model
    is left knowing the format and part of the skill, for RL to improve.

    ``sequences(renderer, stop_ids)``, when given, builds the ``(token ids, loss mask)`` pairs
    instead of the tiny model's own (``demo/tool_sft.py``: SmolLM2's tool format); ``cache_key``
    is what else the cache depends on (e.g. the system prompt).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.model import load_tokenizer, stop_token_ids

    settings = {"task": task, "steps": steps, "seed": seed, "lr": lr, "batch_size": batch_size,
                "n_items": len(items), "target_accuracy": target_accuracy,
                "n_validation": len(validation or []), "check_every": check_every, "min_steps": min_steps,
                **(cache_key or {})}
    marker = out / "warm_start.json"
    if marker.is_file():
        cached = json.loads(marker.read_text())
        if cached.get("settings") == settings:
            log(f"warm start: cached in {out}")
            return cached
    tokenizer = load_tokenizer(base_model)
    renderer = ChatRenderer(tokenizer)
    stops = stop_token_ids(tokenizer, base_model)
    stop = stops[0]
    if sequences is not None:
        seqs = sequences(renderer, stops)
    elif task == "tools":
        assert tool is not None
        seqs = [tools_sequence(renderer, it, stop, tool) for it in items]
    else:
        seqs = [math_sequence(renderer, it, stop) for it in items]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_model)
    t0 = time.perf_counter()
    val_accuracy = None

    def on_step(step: int, loss_value: float) -> bool:
        nonlocal val_accuracy
        if target_accuracy is not None and validation and step >= min_steps and step % check_every == 0:
            if task == "tools":
                assert tool is not None
                val_accuracy = tools_greedy_accuracy(model, renderer, validation, stops, tool)
            else:
                val_accuracy = greedy_accuracy(model, renderer, validation, stops)
            log(f"warm start: step {step} loss {loss_value:.3f} validation accuracy {val_accuracy:.1%}")
            return val_accuracy >= target_accuracy
        if target_accuracy is None and (step % 25 == 0 or step == steps):
            log(f"warm start: step {step}/{steps} loss {loss_value:.3f}")
        return False

    done_steps, loss_value = sft(model, seqs, steps=steps, lr=lr, batch_size=batch_size, seed=seed, on_step=on_step)
    save_checkpoint(model, base_model, out)
    result = {"settings": settings, "steps_run": done_steps, "final_loss": loss_value,
              "validation_accuracy": val_accuracy, "seconds": time.perf_counter() - t0}
    marker.write_text(json.dumps(result, indent=1))
    return result
