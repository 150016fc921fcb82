"""A short scripted session against the tiny model, printing what the gateway recorded.

Builds the tiny model (cached in ``OUT/model``), serves it with the local engine on
127.0.0.1 (``--port``, else a free port), talks to it with the official OpenAI SDK for three turns, rewards the last
turn, exports the session and prints each recorded interaction.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

from rlgate.demo.tiny import build_tiny_model


def ensure_tiny_model(out: Path, seed: int = 0) -> Path:
    model_dir = out / "model"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, seed=seed)
    return model_dir


async def _session(url: str, admin_key: str, tokenizer) -> dict:
    from openai import AsyncOpenAI

    from rlgate.client import GatewayClient

    async with GatewayClient(url, admin_key) as client:
        async with client.session("demo") as s:
            oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key)
            messages: list[Any] = [{"role": "system", "content": "You are a helpful assistant."}]
            for question in ["What is 2 + 3?", "And 10 * 4?", "Thanks!"]:
                messages.append({"role": "user", "content": question})
                reply = await oai.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=24, temperature=1.0, seed=7
                )
                text = reply.choices[0].message.content or ""
                print(f"user: {question}\nassistant ({reply.choices[0].finish_reason}, "
                      f"{reply.usage.completion_tokens if reply.usage else '?'} tokens): {text!r}")
                messages.append({"role": "assistant", "content": text})
            await s.set_reward(1.0)
            await oai.close()
        return await s.export(style="concat")


def run_scripted_demo(out: Path, seed: int = 0, port: int | None = None) -> int:
    """``port``: the gateway's port on 127.0.0.1 (None: a free one)."""
    from rlgate.config import GatewayConfig
    from rlgate.engine.local import LocalEngine
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore

    out.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_tiny_model(out, seed)
    tokenizer = load_tokenizer(model_dir)
    admin_key = secrets.token_urlsafe(32)
    app = create_app(GatewayConfig(admin_key=admin_key, model_name="tiny"), LocalEngine(model_dir), MemoryStore(),
                     tokenizer, stop_token_ids=stop_token_ids(tokenizer, model_dir))
    with ServerThread(app, port=port or 0) as url:
        print(f"gateway on {url} serving the tiny model from {model_dir}\n")
        export = asyncio.run(_session(url, admin_key, tokenizer))
    print(f"\nexported {len(export['interactions'])} sample(s), stats {export['stats']}")
    for sample in export["interactions"]:
        ids, mask = sample["input_ids"], sample["loss_mask"]
        gen = [i for i, m in zip(ids, mask, strict=False) if m]
        lps = [lp for lp, m in zip(sample["logprobs"], mask, strict=False) if m]
        print(f"- {sample['id']} chain={len(sample.get('chain', [sample['id']]))} turns, "
              f"{len(ids)} tokens, {len(gen)} generated, reward={sample['reward']}, "
              f"versions={sorted(set(v for v in sample['versions'] if v >= 0))}, "
              f"mean logprob={sum(lps) / max(1, len(lps)):.3f}")
    path = out / "scripted_session.json"
    path.write_text(json.dumps(export, indent=1))
    print(f"\nfull export written to {path}")
    return 0
