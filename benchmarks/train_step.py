"""GRPO step throughput, and where the wall time of the RL loop goes.

    python benchmarks/train_step.py                       # tiny offline model, math task
    python benchmarks/train_step.py --model DIR           # any HF causal-LM checkpoint
    python benchmarks/train_step.py --demo-summary demo-out/summary.json

1. Starts ``rlgate serve`` (local engine, subprocess) on 127.0.0.1 and runs ``--steps``
   real GRPO steps of the demo's math task with the example SDK agents (half Anthropic,
   half OpenAI), weights pushed through ``/rl/update_weights`` after every step. Prints
   the split of loop wall time: rollout (waiting for groups), train (the GRPO step), sync
   (save safetensors + load into the gateway's engine).
2. Takes the last batch of exported trajectories and times ``GRPOTrainer.step`` on it
   (forward + backward + AdamW, ``--repeats`` times) against a bare baseline on the same
   padded batch: plain ``model(...)`` + masked cross-entropy + backward + the same
   optimiser. Prints tokens/s (all tokens in the batch, and loss tokens) and the ratio.
3. With ``--demo-summary``, also prints the rollout / train fractions of a full demo run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import secrets
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


async def collect(model_dir: Path, workdir: Path, steps: int, groups: int, group_size: int, seed: int):
    """Run ``steps`` GRPO steps through a real gateway; return (history, last batch)."""
    from transformers import AutoModelForCausalLM

    from rlgate.client import GatewayClient
    from rlgate.demo.agents import EitherSDKMathAgent
    from rlgate.demo.rl import _start_gateway
    from rlgate.demo.tasks import TASKS
    from rlgate.rollout.runner import RolloutRunner
    from rlgate.train.grpo import GRPOConfig, GRPOTrainer, LoopState, grpo_loop
    from rlgate.train.sync import RemoteSync

    admin_key = secrets.token_urlsafe(32)
    proc, url = _start_gateway(model_dir, admin_key, workdir / "gateway.log")
    try:
        client = GatewayClient(url, admin_key)
        runner = RolloutRunner(client, EitherSDKMathAgent(model="tiny-policy", max_tokens=8), group_size=group_size,
                               concurrency=groups * group_size, episode_timeout=60)
        split = TASKS["math"](seed=0)
        rng = random.Random(seed)

        def prompts():
            items = list(split.train)
            rng.shuffle(items)
            for i, d in enumerate(items):
                yield f"g-{i}", {**d, "temperature": 1.0}

        trainer = GRPOTrainer(AutoModelForCausalLM.from_pretrained(model_dir),
                              GRPOConfig(lr=1e-4, groups_per_step=groups, micro_batch_size=32, device="cpu"))
        last: dict = {}

        def keep_last(state, result):  # the batch of the last step, and the version it was trained at
            last.update(samples=result.samples, group_ids=[s.group_id for s in result.samples],
                        version=int(result.metrics["version"]) - 1)

        health = await client.health()
        state = await grpo_loop(trainer=trainer, runner=runner, sync=RemoteSync(client, workdir / "sync", keep=1),
                                prompts=prompts(), steps=steps, state=LoopState(version=health["version"]),
                                on_step=keep_last)
        await runner.aclose()
        await client.aclose()
        return state.history, last
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def time_steps(model_dir: Path, last: dict, repeats: int) -> tuple[list[float], list[float], int, int]:
    """Seconds per GRPO step and per bare step on the same batch; batch and loss token counts."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.train.grpo import GRPOConfig, GRPOTrainer
    from rlgate.trajectory.export import to_padded_tensors

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    samples, gids, version = last["samples"], last["group_ids"], last["version"]
    batch = to_padded_tensors(samples)
    real_tokens = int(batch["attention_mask"].sum())
    loss_tokens = int(batch["loss_mask"].sum())
    micro = 32

    trainer = GRPOTrainer(copy.deepcopy(base), GRPOConfig(lr=1e-4, micro_batch_size=micro, device="cpu"))
    bare = copy.deepcopy(base).train()
    opt = torch.optim.AdamW(bare.parameters(), lr=1e-4)

    def bare_step() -> None:
        n = batch["input_ids"].shape[0]
        for s in range(0, n, micro):
            ids = batch["input_ids"][s:s + micro]
            logits = bare(input_ids=ids, attention_mask=batch["attention_mask"][s:s + micro].long()).logits
            mask = batch["loss_mask"][s:s + micro, 1:]
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
            ((ce * mask).sum() / loss_tokens).backward()
        torch.nn.utils.clip_grad_norm_(bare.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def grpo_step() -> None:
        trainer.step(samples, gids, version)

    grpo_t, bare_t = [], []
    grpo_step(), bare_step()  # warm-up
    for _ in range(repeats):  # interleaved, so machine noise hits both alike
        t = time.perf_counter()
        grpo_step()
        grpo_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        bare_step()
        bare_t.append(time.perf_counter() - t)
    return grpo_t, bare_t, real_tokens, loss_tokens


def fractions(history: list[dict]) -> dict[str, float]:
    rollout = sum(h["rollout_s"] for h in history)
    train = sum(h["train_s"] for h in history)
    sync = sum(h["sync_s"] for h in history)
    total = rollout + train + sync
    return {"rollout": rollout / total, "train": train / total, "sync": sync / total,
            "seconds_per_step": total / len(history)}


def main() -> None:
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="HF checkpoint directory (default: build the tiny model)")
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps through the gateway")
    ap.add_argument("--groups", type=int, default=8, help="groups per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5, help="timed GRPO steps on the last batch")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--demo-summary", help="a demo's summary.json: print its rollout / train split too")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.model:
            model_dir = Path(args.model)
        else:
            from rlgate.demo.scripted import ensure_tiny_model

            model_dir = ensure_tiny_model(workdir)
        print(f"model: {model_dir if args.model else 'tiny (built offline)'}; torch threads {torch.get_num_threads()}")
        history, last = asyncio.run(collect(model_dir, workdir, args.steps, args.groups, args.group_size, args.seed))
        f = fractions(history)
        print(f"\nRL loop, {args.steps} steps x {args.groups} groups x {args.group_size} episodes "
              f"({f['seconds_per_step']:.2f} s/step):")
        print(f"  rollout {f['rollout']:6.1%}   train {f['train']:6.1%}   weight sync {f['sync']:6.1%}")

        grpo_t, bare_t, tokens, loss_tokens = time_steps(model_dir, last, args.repeats)
    g, b = statistics.median(grpo_t), statistics.median(bare_t)
    n = len(last["samples"])
    print(f"\nGRPO step on the last exported batch: {n} samples, {tokens} tokens ({loss_tokens} with loss), "
          f"median of {args.repeats}")
    print(f"  {'':24}{'s/step':>9}{'tokens/s':>11}{'loss tok/s':>12}")
    print(f"  {'rlgate GRPOTrainer.step':24}{g:9.3f}{tokens / g:11,.0f}{loss_tokens / g:12,.0f}")
    print(f"  {'bare fwd+bwd+AdamW':24}{b:9.3f}{tokens / b:11,.0f}{loss_tokens / b:12,.0f}")
    print(f"  ratio rlgate / bare: {g / b:.2f}x time")

    if args.demo_summary:
        s = json.loads(Path(args.demo_summary).read_text())
        f = fractions(s["history"])
        print(f"\ndemo run {args.demo_summary}: {len(s['history'])} steps, {f['seconds_per_step']:.2f} s/step; "
              f"rollout {f['rollout']:.1%}, train {f['train']:.1%}, weight sync {f['sync']:.1%} "
              f"(evaluations excluded; whole run {s['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
