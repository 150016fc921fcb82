"""Prefill speed of the local engine on long prompts (Claude Code's default prompt is ~62k tokens).

    python benchmarks/long_prefill.py                          # tiny offline model, 8k / 32k / 64k
    python benchmarks/long_prefill.py --model DIR --lengths 8192 65536 --device cuda

For each prompt length, one request with ``max_new_tokens=1`` goes through ``LocalEngine``
(prefill + one sampled token): prints the time to the first token, prompt tokens/s, and the
process's peak resident memory so far. A second request with the same prompt is timed too:
the local engine has no prefix cache, so it costs the same (a remote SGLang / vLLM engine
with prefix caching serves the second one from its cache). The model's RoPE lets it run
past its trained length; quality is not the point, cost is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


async def prefill_seconds(engine, prompt: list[int]) -> float:
    from rlgate.engine.base import GenerateRequest, SamplingParams

    start = time.perf_counter()
    await engine.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=1, temperature=1.0, seed=0)))
    return time.perf_counter() - start


async def run(model_dir: Path, args: argparse.Namespace) -> None:
    from rlgate.engine.local import LocalEngine

    longest = max(args.lengths)
    engine = LocalEngine(model_dir, device=args.device, max_context_length=longest + 16)
    await engine.start()
    try:
        vocab = engine.model.get_input_embeddings().num_embeddings
        print(f"model {model_dir} on {engine.device}; torch threads {__import__('torch').get_num_threads()}")
        await prefill_seconds(engine, [5] * 256)  # warm-up
        print(f"{'prompt':>8} {'first token s':>14} {'prompt tok/s':>13} {'again s':>8} {'peak RSS GiB':>13}")
        rng = random.Random(0)
        for n in sorted(args.lengths):
            prompt = [rng.randrange(3, vocab) for _ in range(n)]
            first = await prefill_seconds(engine, prompt)
            again = await prefill_seconds(engine, prompt) if args.repeat else float("nan")
            print(f"{n:>8} {first:>14.2f} {n / first:>13.0f} {again:>8.2f} {peak_rss_gib():>13.2f}", flush=True)
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: build the tiny model)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 65536])
    parser.add_argument("--no-repeat", dest="repeat", action="store_false", help="skip the second, identical prompt")
    args = parser.parse_args()
    if args.model is not None:
        asyncio.run(run(args.model, args))
        return
    from rlgate.demo.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(build_tiny_model(Path(tmp) / "tiny"), args))


if __name__ == "__main__":
    main()
