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

``--synthetic`` skips the gateway: the batch is the demo's math prompts (the real model's task with
``--model``) as the gateway renders them, each followed by ``--completion`` sampled tokens whose
recorded logprobs are the model's own (an on-policy batch). ``--variants`` then times, interleaved
on that batch: the GRPO step (logits trimmed to the generated span, the default; and with every
logit), the bare step, the bare step under bf16 autocast, the GRPO step with bf16 weights
(``train.dtype``) and with gradient checkpointing; and reports the padding in the batch (what
sequence packing could save at most)::

    python benchmarks/train_step.py --model DIR --synthetic --variants --repeats 3
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

    grpo_t: list[float] = []
    bare_t: list[float] = []
    grpo_step()  # warm-up
    bare_step()
    for _ in range(repeats):  # interleaved, so machine noise hits both alike
        t = time.perf_counter()
        grpo_step()
        grpo_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        bare_step()
        bare_t.append(time.perf_counter() - t)
    return grpo_t, bare_t, real_tokens, loss_tokens


def synthetic_batch(model_dir: Path, groups: int, group_size: int, completion: int, seed: int) -> dict:
    """The demo's prompts as the gateway renders them + ``completion`` tokens sampled from the model
    (their recorded logprobs are the model's own: an on-policy batch), as exported samples."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.chat.conversation import Message
    from rlgate.chat.render import ChatRenderer
    from rlgate.demo.real import real_task
    from rlgate.demo.tasks import TASKS
    from rlgate.model import load_tokenizer
    from rlgate.train.loss import token_logprobs
    from rlgate.trajectory.sample import Sample

    renderer = ChatRenderer(load_tokenizer(model_dir))
    real = (model_dir / "rlgate-gguf.json").is_file()
    items = (real_task if real else TASKS["math"])(seed=0).train[:groups]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    samples: list[Sample] = []
    gids: list[str] = []
    for g, it in enumerate(items):
        prompt = renderer.render_ids([Message.of("user", it["question"])])
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=True, max_new_tokens=completion,
                                 min_new_tokens=completion, num_return_sequences=group_size, top_k=0, pad_token_id=0)
            lps = token_logprobs(model(input_ids=out).logits, out)
        for row, lp_row in zip(out.tolist(), lps.tolist(), strict=True):
            ids, lp = row, lp_row
            n = len(prompt)
            samples.append(Sample(id=f"s{len(samples)}", input_ids=ids, loss_mask=[0] * n + [1] * completion,
                                  logprobs=[0.0] * n + lp[n:], versions=[-1] * n + [0] * completion,
                                  reward=float(len(samples) % 2)))
            gids.append(f"g{g}")
    return {"samples": samples, "group_ids": gids, "version": 0}


def time_variants(model_dir: Path, last: dict, repeats: int, micro: int,
                  only: list[str] | None = None) -> list[tuple[str, list[tuple[float, float]]]]:
    """(wall, CPU) seconds per step of each variant on the same batch, interleaved. CPU time (every
    thread of this process) is the work done: on a shared machine the load inflates wall time, not it."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.train.grpo import GRPOConfig, GRPOTrainer
    from rlgate.trajectory.export import to_padded_tensors

    samples, gids, version = last["samples"], last["group_ids"], last["version"]
    batch = to_padded_tensors(samples)
    loss_tokens = int(batch["loss_mask"].sum())

    def grpo(trim: bool = True, dtype: torch.dtype = torch.float32, checkpointing: bool = False, share: bool = True,
             autocast: bool = False, lora: int = 0, stale: bool = False):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora, lora_alpha=2 * lora, target_modules="all-linear",
                                                     task_type="CAUSAL_LM"))
        trainer = GRPOTrainer(model, GRPOConfig(lr=1e-5, micro_batch_size=micro, device="cpu", trim_logits=trim,
                                                share_prompt=share), autocast="bfloat16" if autocast else None)
        # stale: every sample one version behind the trainer (rollouts overlapping the update, max_staleness 1)
        return lambda: trainer.step(samples, gids, version + 1 if stale else version)

    def bare(autocast: bool = False):
        model = AutoModelForCausalLM.from_pretrained(model_dir).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step() -> None:
            n = batch["input_ids"].shape[0]
            for s in range(0, n, micro):
                ids = batch["input_ids"][s:s + micro]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    logits = model(input_ids=ids, attention_mask=batch["attention_mask"][s:s + micro].long()).logits
                mask = batch["loss_mask"][s:s + micro, 1:]
                ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:],
                                                       reduction="none")
                ((ce * mask).sum() / loss_tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    factories = {"bare fwd+bwd+AdamW": lambda: bare(), "GRPO step (the default: shared prompt, trimmed logits)": lambda: grpo(),
                 "GRPO step, every prompt run": lambda: grpo(share=False),
                 "GRPO step, every prompt run, every logit": lambda: grpo(share=False, trim=False),
                 "bare, bf16 autocast": lambda: bare(autocast=True),
                 "GRPO step, train.dtype mixed (bf16 autocast)": lambda: grpo(autocast=True),
                 "GRPO step, bf16 weights": lambda: grpo(dtype=torch.bfloat16),
                 "GRPO step, LoRA r=16": lambda: grpo(lora=16),
                 "GRPO step, LoRA r=16, mixed": lambda: grpo(lora=16, autocast=True),
                 "GRPO step, LoRA r=16, mixed, every sample one version stale": lambda: grpo(lora=16, autocast=True, stale=True),
                 "GRPO step, grad checkpointing": lambda: grpo(checkpointing=True)}
    # each variant's model is built only if it is timed; the first (bare) always is: the ratios are against it
    variants = {k: make() for i, (k, make) in enumerate(factories.items()) if i == 0 or not only or any(o in k for o in only)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in variants.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - t, time.process_time() - c))
    return list(times.items())


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
    ap.add_argument("--synthetic", action="store_true", help="no gateway: a sampled on-policy batch of the demo's prompts")
    ap.add_argument("--completion", type=int, default=8, help="--synthetic: generated tokens per sample")
    ap.add_argument("--variants", action="store_true", help="time bf16, checkpointing, every-logit variants too")
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--only", nargs="*", help="--variants: time only the variants whose names contain one of these "
                    "(and bare, the reference)")
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
        if args.synthetic:
            last = synthetic_batch(model_dir, args.groups, args.group_size, args.completion, args.seed)
        else:
            history, last = asyncio.run(collect(model_dir, workdir, args.steps, args.groups, args.group_size,
                                                args.seed))
            f = fractions(history)
            print(f"\nRL loop, {args.steps} steps x {args.groups} groups x {args.group_size} episodes "
                  f"({f['seconds_per_step']:.2f} s/step):")
            print(f"  rollout {f['rollout']:6.1%}   train {f['train']:6.1%}   weight sync {f['sync']:6.1%}")
        if args.variants:
            from rlgate.trajectory.export import to_padded_tensors

            batch = to_padded_tensors(last["samples"])
            real, padded = int(batch["attention_mask"].sum()), batch["attention_mask"].numel()
            loss_tokens = int(batch["loss_mask"].sum())
            print(f"\nbatch: {len(last['samples'])} samples, {real} tokens ({loss_tokens} with loss), padded to "
                  f"{padded} ({1 - real / padded:.1%} padding: the most packing could save); load "
                  f"{os.getloadavg()[0]:.1f}")
            rows = time_variants(model_dir, last, args.repeats, args.micro_batch, args.only)
            base_w = min(w for w, _ in rows[0][1])
            base_c = statistics.median(c for _, c in rows[0][1])
            print(f"\n| variant ({args.repeats} interleaved repeats) | wall s/step (min) | tokens/s | CPU s/step (median) "
                  "| CPU vs bare |\n|---|---|---|---|---|")
            for name, ts in rows:
                w, c = min(x for x, _ in ts), statistics.median(y for _, y in ts)
                print(f"| {name} | {w:.3f} | {real / w:,.0f} | {c:.2f} | {c / base_c:.2f}x (wall {w / base_w:.2f}x) |")
            print(f"load after: {os.getloadavg()[0]:.1f}")
            return

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
