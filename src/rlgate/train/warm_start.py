"""``warm_start:``: a few supervised steps on example conversations before RL.

A small model often cannot produce what an agent needs at all: SmolLM2-135M-Instruct, told about a
tool, writes no parseable tool call (0 in 80 episodes of docs/training.md §0's agent), so every
GRPO group ties and RL has nothing to learn from. A handful of example conversations fixes that,
and this is where a user gives them: ``warm_start: {dataset: demos.jsonl, steps: 8}`` in a training
config. Each item is one conversation in the OpenAI Chat Completions format (``{"messages": [...],
"tools": [...]}``, the request body's fields; assistant turns with ``content`` and/or
``tool_calls``, tool results as ``tool`` messages).

The conversations are tokenised **as the gateway will serve them**: the prompt by the renderer the
run's gateway builds (``core/generation.serving_renderer``: the model family's template, and with
``gateway.tool_prompt: auto`` the tools described in the system message), each assistant reply as
the text the model must generate followed by its stop token, and each later turn by the gateway's
own bridge (``bridge_ids``), exactly the tokens a multi-turn episode records. The loss is on the
assistant replies and their stop tokens only. A tool call is written in the ``<tool_call>[...]
</tool_call>`` form the ``hermes`` family of parsers reads (SmolLM2, Qwen, and any template the
tool prompt describes); a model whose parser reads another format is refused for conversations with
tool calls. Reasoning text is not trained.

The result is a full checkpoint in ``out_dir/warm-start/`` (weights, tokenizer, generation config),
cached: a rerun with the same model, data and settings reuses it; the run then starts from it
(serving, training, the KL reference, ``rlgate check`` and ``rlgate eval``).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlgate.chat.conversation import Message, ToolSpec
from rlgate.chat.families.base import ParentTurn
from rlgate.chat.tool_prompt import TOOL_PROMPT_PARSERS, call_text
from rlgate.rollout.errors import RunError

__all__ = ["TOKENIZER_FILES", "conversation_sequence", "save_checkpoint", "sft", "starting_model"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")
DIR = "warm-start"


def _reply_text(m: Message) -> str:
    return m.text + (call_text(m.tool_calls) if m.tool_calls else "")


def conversation_sequence(renderer: Any, messages: list[Message], tools: list[ToolSpec] | None,
                          stop_id: int) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one conversation as the gateway serves and records it: the prompt up to
    the first assistant reply, each reply + ``stop_id`` (mask 1), and between replies the gateway's
    bridge for the messages that came in (mask 0). Messages after the last reply are not used."""
    firsts = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if not firsts:
        raise ValueError("has no assistant message to learn from")
    system = messages[0] if messages[0].role == "system" else None
    first = firsts[0]
    prompt = renderer.render_ids(messages[:first], tools or None)
    ids, mask = list(prompt), [0] * len(prompt)
    stop_text = renderer.decode([stop_id])
    for k, i in enumerate(firsts):
        reply = messages[i]
        out = renderer.encode(_reply_text(reply)) + [stop_id]
        parent = ParentTurn(list(ids), out, reply, stop_text)
        ids += out
        mask += [1] * len(out)
        if k + 1 < len(firsts):
            incoming = messages[i + 1: firsts[k + 1]]
            if not incoming:
                raise ValueError(f"messages[{i}] and messages[{firsts[k + 1]}]: two assistant messages in a row")
            bridge = renderer.bridge_ids(parent=parent, leading_system=system, new_messages=incoming,
                                         tools=tools or None)
            ids += bridge
            mask += [0] * len(bridge)
    return ids, mask


def sft(model: Any, seqs: list[tuple[list[int], list[int]]], *, steps: int, lr: float, batch_size: int, seed: int,
        on_step: Callable[[int, float], bool] | None = None) -> tuple[int, float]:
    """``steps`` AdamW steps (gradient norm clipped at 1) of next-token loss on the masked tokens of batches
    drawn from ``seqs``; ``on_step(step, loss)`` returning True stops early. Returns (steps run, last loss)."""
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    loss_value, done = float("nan"), 0
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
            labels[b, :n] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss  # shifted inside the model
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value, done = float(loss.detach()), step
        if on_step is not None and on_step(step, loss_value):
            break
    model.eval()
    return done, loss_value


def save_checkpoint(model: Any, base: Path, out: Path) -> None:
    """``model``'s weights into ``out`` with ``base``'s tokenizer files and generation config: a checkpoint
    the gateway and the trainer load as they load ``base``."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy(base / name, out / name)


def _sequences(cfg: Any, model_dir: Path, items: list[dict[str, Any]]) -> tuple[list[tuple[list[int], list[int]]], str]:
    from pydantic import ValidationError

    from rlgate.api.openai_chat.protocol import ChatCompletionRequest
    from rlgate.api.openai_chat.serving import to_chat_request
    from rlgate.core.generation import serving_renderer
    from rlgate.errors import GatewayError
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.train.config import ConfigError
    from rlgate.train.gateway import GatewayPlan, served_config

    tokenizer = load_tokenizer(model_dir)
    try:
        family, parser, renderer, _ = serving_renderer(served_config(GatewayPlan.of(cfg), "-"), tokenizer)
    except ValueError as exc:
        raise ConfigError(f"warm_start: {exc}") from None
    stop = dict.fromkeys([*stop_token_ids(tokenizer, model_dir), *family.stop_token_ids(tokenizer)])
    stop_id = next(iter(stop))
    seqs = []
    for n, item in enumerate(items, 1):
        where = f"warm_start.dataset item {n}"
        if not isinstance(item, dict) or not isinstance(item.get("messages"), list):
            raise ConfigError(f"{where}: needs \"messages\": a list of Chat Completions messages")
        try:
            body = ChatCompletionRequest.model_validate({"model": "warm-start", "messages": item["messages"],
                                                         "tools": item.get("tools")})
            chat = to_chat_request(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        except GatewayError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if any(m.tool_calls for m in chat.messages) and parser not in TOOL_PROMPT_PARSERS:
            raise ConfigError(f"{where}: has tool calls, and the {family.title} family's tool parser ({parser or 'none'})"
                              f" reads no format a warm start writes (the <tool_call> format of "
                              f"{', '.join(TOOL_PROMPT_PARSERS)}: gateway.tool_parser: hermes)")
        try:
            seqs.append(conversation_sequence(renderer, chat.messages, chat.tools, stop_id))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return seqs, renderer.name


def starting_model(cfg: Any, model_dir: Path, *, log: Callable[[str], Any] = print) -> Path:
    """The checkpoint a run starts from: ``model_dir``, or with a ``warm_start:`` section its warm start in
    ``out_dir/warm-start`` (made now, or reused when the model, data and settings are the same)."""
    ws = cfg.warm_start
    if ws is None:
        return model_dir
    from rlgate.train.loading import load_dataset

    items = load_dataset(ws.dataset, "warm_start.dataset")
    out = Path(cfg.out_dir) / DIR
    settings = {"model": str(model_dir), "steps": ws.steps, "lr": ws.lr, "batch_size": ws.batch_size,
                "seed": cfg.seed, "tool_prompt": cfg.gateway.tool_prompt, "tool_parser": cfg.gateway.tool_parser,
                "data": hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()}
    marker = out / "warm_start.json"
    if marker.is_file():
        try:
            cached = json.loads(marker.read_text())
        except (OSError, ValueError):
            cached = {}
        if cached.get("settings") == settings:
            log(f"warm start: {out} (made earlier with these settings)")
            return out
    import torch
    from transformers import AutoModelForCausalLM

    seqs, renderer = _sequences(cfg, model_dir, items)
    trained = sum(sum(m) for _, m in seqs)
    log(f"warm start: {len(seqs)} conversations ({trained} trained tokens, rendered by {renderer}), "
        f"{ws.steps} steps of {min(ws.batch_size, len(seqs))} at lr {ws.lr:g}")
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - name the checkpoint, not transformers' internals
        raise RunError(f"warm_start: cannot load {model_dir}: {type(exc).__name__}: {exc}") from None
    losses: list[float] = []

    def on_step(step: int, loss: float) -> bool:
        losses.append(loss)
        if step == 1 or step == ws.steps or step % 10 == 0:
            log(f"warm start: step {step}/{ws.steps} loss {loss:.3f}")
        return False

    sft(model, seqs, steps=ws.steps, lr=ws.lr, batch_size=ws.batch_size, seed=cfg.seed, on_step=on_step)
    marker.unlink(missing_ok=True)  # a crash while saving leaves no marker: the next run makes it again
    save_checkpoint(model, model_dir, out)
    result = {"settings": settings, "conversations": len(seqs), "trained_tokens": trained, "losses": losses,
              "seconds": round(time.perf_counter() - t0, 2)}
    marker.write_text(json.dumps(result, indent=1))
    log(f"warm start: saved {out} in {result['seconds']:.0f} s")
    return out
