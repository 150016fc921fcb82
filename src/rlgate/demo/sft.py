"""Supervised warm start: teach the tiny model the task's format, stop while it is mediocre.

Training sequences are built with the gateway's own renderer, so the model learns exactly
the token layout it will see when agents talk to it through rlgate (for the tools task:
prompt, tool call, the bridge carrying the tool result, final answer — loss only on the
assistant's tokens). The result is cached: ``warm_start`` returns at once when ``out``
already holds a checkpoint made with the same settings.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

from rlgate.chat.conversation import Message, ToolCall, ToolSpec
from rlgate.chat.render import ChatRenderer

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


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
    bridge = renderer.bridge_ids(leading_system=None, parent_reply=reply,
                                 parent_stop_text=renderer.decode([stop_id]),
                                 new_messages=[Message.of("tool", item["answer"], tool_call_id="call_0")],
                                 tools=tools)
    out2 = renderer.encode(item["answer"]) + [stop_id]
    ids = prompt + out1 + bridge + out2
    mask = [0] * len(prompt) + [1] * len(out1) + [0] * len(bridge) + [1] * len(out2)
    return ids, mask


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
    log: Any = print,
) -> dict[str, Any]:
    """Fine-tune ``base_model`` on ``items`` for ``steps`` steps into ``out`` (cached)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.model import load_tokenizer, stop_token_ids

    settings = {"task": task, "steps": steps, "seed": seed, "lr": lr, "batch_size": batch_size,
                "n_items": len(items)}
    marker = out / "warm_start.json"
    if marker.is_file():
        cached = json.loads(marker.read_text())
        if cached.get("settings") == settings:
            log(f"warm start: cached in {out}")
            return cached
    tokenizer = load_tokenizer(base_model)
    renderer = ChatRenderer(tokenizer)
    stop = stop_token_ids(tokenizer, base_model)[0]
    if task == "tools":
        assert tool is not None
        seqs = [tools_sequence(renderer, it, stop, tool) for it in items]
    else:
        seqs = [math_sequence(renderer, it, stop) for it in items]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0 = time.perf_counter()
    loss_value = float("nan")
    for step in range(1, steps + 1):
        batch = rng.sample(seqs, min(batch_size, len(seqs)))
        width = max(len(ids) for ids, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        att = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for b, (seq, mask) in enumerate(batch):
            n = len(seq)
            ids[b, :n] = torch.tensor(seq)
            att[b, :n] = 1
            labels[b, :n] = torch.tensor([t if m else -100 for t, m in zip(seq, mask)])
        # labels are shifted inside the model: position t predicts token t
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())
        if step % 25 == 0 or step == steps:
            log(f"warm start: step {step}/{steps} loss {loss_value:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in _TOKENIZER_FILES:
        if (base_model / name).is_file():
            shutil.copy(base_model / name, out / name)
    for name in ("generation_config.json",):
        if (base_model / name).is_file():
            shutil.copy(base_model / name, out / name)
    result = {"settings": settings, "final_loss": loss_value, "seconds": time.perf_counter() - t0}
    marker.write_text(json.dumps(result, indent=1))
    return result
