"""Aggregate decode throughput of LocalEngine vs sequential ``model.generate``.

    python benchmarks/engine_throughput.py                 # tiny offline model
    python benchmarks/engine_throughput.py --model DIR     # any HF causal-LM checkpoint

Every request generates exactly ``--max-new-tokens`` tokens (no stop tokens), from
prompts of varied lengths. Prints generated tokens/s at each concurrency level, the
sequential ``model.generate`` baseline, and the ratio of the highest to the lowest level.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(16, 64))] for _ in range(n)]


async def engine_tokens_per_s(engine, prompts: list[list[int]], max_new_tokens: int) -> float:
    from rlgate.engine.base import GenerateRequest, SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
    start = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(GenerateRequest(p, params)) for p in prompts))
    elapsed = time.perf_counter() - start
    return sum(len(r.output_ids) for r in results) / elapsed


def generate_tokens_per_s(model, prompts: list[list[int]], max_new_tokens: int) -> float:
    import torch

    total = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                eos_token_id=None,
                pad_token_id=0,
            )
            total += out.shape[1] - ids.shape[1]
    return total / (time.perf_counter() - start)


async def run(model_dir: Path, args: argparse.Namespace) -> None:
    from rlgate.engine.local import LocalEngine

    engine = LocalEngine(model_dir, device=args.device)
    await engine.start()
    vocab = engine.model.get_input_embeddings().num_embeddings
    print(f"model {model_dir} on {engine.device}, max_new_tokens={args.max_new_tokens}")
    await engine_tokens_per_s(engine, make_prompts(4, vocab, seed=99), 8)  # warm-up
    rates: dict[int, float] = {}
    for n in args.concurrency:
        rates[n] = await engine_tokens_per_s(engine, make_prompts(n, vocab, seed=n), args.max_new_tokens)
        print(f"LocalEngine, {n:3d} concurrent     {rates[n]:9.1f} tok/s")
    model = engine.model
    # Close first: the baseline then runs with a single thread driving torch, as the engine did
    # (on a small CPU, two threads' OpenMP pools slow each other down).
    await engine.close()
    baseline = generate_tokens_per_s(model, make_prompts(args.baseline_requests, vocab), args.max_new_tokens)
    print(f"sequential model.generate       {baseline:9.1f} tok/s")
    lo, hi = min(rates), max(rates)
    print(f"ratio {hi}-concurrent / {lo}-concurrent: {rates[hi] / rates[lo]:.2f}x")
    print(f"ratio {hi}-concurrent / sequential generate: {rates[hi] / baseline:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: build the tiny model)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--baseline-requests", type=int, default=4)
    args = parser.parse_args()
    if args.model is not None:
        asyncio.run(run(args.model, args))
        return
    from rlgate.demo.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(build_tiny_model(Path(tmp) / "tiny"), args))


if __name__ == "__main__":
    main()
