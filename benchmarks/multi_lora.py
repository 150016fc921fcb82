"""Many policies on one base model: what 8 resident LoRA adapters cost the local engine, in one run.

    python benchmarks/multi_lora.py                       # SmolLM2-135M-Instruct (rlgate models fetch ...)
    python benchmarks/multi_lora.py --model DIR --rounds 5 --tokens 64

Prints three ratios, each measured side by side in this one process (the machine's load, printed with
them, falls on both sides alike):

* **memory**: the process's resident memory (RSS) with 8 adapters resident (r = 16, alpha = 32, every
  linear layer: ``train.lora``'s defaults) and a mixed batch served, against the same engine with no
  adapter after serving the same batch on the base; and the weights' bytes alone (the adapters' stacked
  weights against the model's parameters).
* **throughput**: generated tokens per second of 8 concurrent requests (``--tokens`` new tokens each,
  T = 1, no stop token; a different question each) spread over the 8 adapters, against 8 on one policy:
  the base model, and one adapter. Rounds alternate (base, one adapter, 8 adapters, ...); the median of ``--rounds`` each.
* **push**: time to publish an adapter (the trainer saves it with PEFT's ``save_pretrained``, the engine
  loads it: ``load_adapter``) against a full weight push (``save_pretrained`` of the merged model, then
  ``update_weights_from_path``), and the bytes each writes. Median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def load_avg() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def make_adapters(model_dir: Path, out: Path, n: int, r: int) -> list[Path]:
    """``n`` PEFT adapters (``train.lora``'s defaults at rank ``r``) with random nonzero B, as after training."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM"))
    paths = []
    for k in range(n):
        gen = torch.Generator().manual_seed(k)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        peft.save_pretrained(out / f"adapter-{k}")
        paths.append(out / f"adapter-{k}")
    return paths


async def tokens_per_s(engine, adapters: list[str | None], prompts: list[list[int]], tokens: int, seed: int) -> float:
    """Tokens per second of one request per adapter (``prompts[i]`` for the i-th), all in flight together."""
    from rlgate.engine import GenerateRequest, SamplingParams

    reqs = [GenerateRequest(list(prompts[i]), SamplingParams(max_new_tokens=tokens, seed=seed + i), adapter=a,
                            session_id=f"s{i}") for i, a in enumerate(adapters)]
    t = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in reqs))
    elapsed = time.perf_counter() - t
    return sum(len(r.output_ids) for r in results) / elapsed


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir()) / 2**20


async def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from rlgate.checkpoints import resolve_model
    from rlgate.engine.local import LocalEngine

    model_dir = Path(args.model) if args.model else resolve_model("smollm2-135m-instruct")
    work = Path(tempfile.mkdtemp(prefix="multi-lora-"))
    try:
        print(f"model {model_dir}; {args.adapters} adapters r={args.rank}; {load_avg()}", flush=True)
        paths = make_adapters(model_dir, work, args.adapters, args.rank)
        tok = AutoTokenizer.from_pretrained(model_dir)
        # a different question per request: no variant gets the engine's shared-prompt prefill (a GRPO group's)
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Which is larger, {40 + k} or {52 + 3 * k}? "
                                             "Explain."}], add_generation_prompt=True, tokenize=True, return_dict=False)
                   for k in range(args.adapters)]
        engine = LocalEngine(model_dir, device="cpu", max_batch_size=args.adapters,
                             max_rows_per_session=args.adapters)
        await engine.start()
        n = args.adapters
        # memory: the base alone after serving a batch, then with every adapter resident after a mixed batch
        await tokens_per_s(engine, [None] * n, prompts, args.tokens, 0)
        rss_base = rss_mb()
        model_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        for k, p in enumerate(paths):
            await engine.load_adapter(f"a{k}", str(p))
        await tokens_per_s(engine, [f"a{k}" for k in range(n)], prompts, args.tokens, 0)
        rss_adapters = rss_mb()
        adapter_bytes = engine._adapters.parameter_bytes()
        print(f"memory: RSS {rss_base:.0f} MB (base) -> {rss_adapters:.0f} MB ({n} adapters resident): "
              f"{rss_adapters / rss_base:.3f}x; weights {model_bytes / 2**20:.0f} MB + adapters "
              f"{adapter_bytes / 2**20:.1f} MB: {(model_bytes + adapter_bytes) / model_bytes:.3f}x", flush=True)
        # throughput: rounds alternate so that the machine's load falls on every variant alike
        variants = {"base": [None] * n, "one adapter": ["a0"] * n, f"{n} adapters": [f"a{k}" for k in range(n)]}
        rates: dict[str, list[float]] = {k: [] for k in variants}
        for rnd in range(args.rounds):
            for name, adapters in variants.items():
                rates[name].append(await tokens_per_s(engine, adapters, prompts, args.tokens, 100 * rnd))
            print(f"round {rnd}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in rates.items())
                  + f"; {load_avg()}", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        spread = med[f"{n} adapters"]
        print(f"throughput (median of {args.rounds}): " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in med.items())
              + f"; {n} adapters / base {spread / med['base']:.3f}x, / one adapter "
              f"{spread / med['one adapter']:.3f}x", flush=True)
        # push: an adapter (save + load) against the full weights (save + load)
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        from rlgate.train.policy import save_for_serving

        trainer = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), paths[0],
                                            is_trainable=True)
        pushes: dict[str, list[float]] = {"adapter": [], "full": []}
        sizes: dict[str, float] = {}
        for rnd in range(args.rounds):
            out = work / f"push-a-{rnd}"
            t = time.perf_counter()
            await asyncio.to_thread(trainer.save_pretrained, out)
            await engine.load_adapter("a0", str(out))
            pushes["adapter"].append(time.perf_counter() - t)
            sizes["adapter"] = dir_mb(out)
            out = work / f"push-f-{rnd}"
            t = time.perf_counter()
            await asyncio.to_thread(save_for_serving, trainer, out)
            await engine.update_weights_from_path(str(out))
            pushes["full"].append(time.perf_counter() - t)
            sizes["full"] = dir_mb(out)
            print(f"push round {rnd}: adapter {pushes['adapter'][-1]:.2f} s, full {pushes['full'][-1]:.2f} s; "
                  f"{load_avg()}", flush=True)
        pa, pf = statistics.median(pushes["adapter"]), statistics.median(pushes["full"])
        print(f"push (median of {args.rounds}, save + load): adapter {pa:.2f} s ({sizes['adapter']:.1f} MB), full "
              f"weights {pf:.2f} s ({sizes['full']:.0f} MB): adapter / full {pa / pf:.3f}x", flush=True)
        await engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: SmolLM2-135M-Instruct, fetched once)")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
