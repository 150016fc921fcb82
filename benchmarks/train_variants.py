"""LoRA vs full fine-tuning, bfloat16, gradient checkpointing: the demo's math task, side by side.

    python benchmarks/train_variants.py --out /tmp/variants --steps 30          # every variant
    python benchmarks/train_variants.py --out /tmp/variants --variants full lora

Builds the tiny model and the demo's math warm start (cached in ``--out``, as ``rlgate demo``
does), then runs each variant as its own ``rlgate train``-equivalent process (``run_training``
with the in-process gateway) for ``--steps`` GRPO steps from the same warm start, with the same
seed and seeded sampling (``rollout.seed``), one after the other. Per variant: held-out accuracy
(the demo's 200 held-out questions, sampled at T = 1, 2 samples each) before and after, the mean
time of the training part of a step (forward + backward + AdamW; ``train_s``) and of a whole
step, the trainable parameters, the bytes of weights + gradients + AdamW state, and the
process's peak RSS. Prints a Markdown table; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"train": {"lora": {"r": 16, "alpha": 32}}, "grpo": {"lr": 1e-3}},
    "bf16": {"train": {"dtype": "bfloat16"}},
    "checkpointing": {"train": {"gradient_checkpointing": True}},
}


def prepare(out: Path) -> Path:
    """The demo's math warm start (cached) and the data files; returns the warm-started model."""
    from rlgate.demo.rl import DemoSettings
    from rlgate.demo.scripted import ensure_tiny_model
    from rlgate.demo.sft import warm_start
    from rlgate.demo.tasks import TASKS
    from rlgate.trajectory.export import write_jsonl

    settings = DemoSettings.for_task("math")
    base = ensure_tiny_model(out)
    split = TASKS["math"](seed=0)
    validation = split.train[:settings.validation_items]
    warm = out / "warm-start-math-seed0"
    warm_start(base, warm, split.train[len(validation):], task="math", steps=settings.warm_start_steps, seed=0,
               lr=settings.warm_start_lr, batch_size=settings.warm_start_batch, target_accuracy=settings.warm_start_target,
               validation=validation, check_every=settings.check_every, log=print)
    write_jsonl(split.train, out / "math-train.jsonl")
    write_jsonl(split.heldout[:settings.eval_items], out / "math-heldout.jsonl")
    return warm


def config(out: Path, warm: Path, name: str, steps: int) -> Any:
    from rlgate.demo.rl import DemoSettings
    from rlgate.train.config import TrainConfig

    s = DemoSettings.for_task("math")
    raw: dict[str, Any] = {
        "model": str(warm), "out_dir": str(out / f"run-{name}"), "dataset": str(out / "math-train.jsonl"),
        "eval_dataset": str(out / "math-heldout.jsonl"), "eval_samples_per_item": 2, "eval_temperature": 1.0,
        "agent": "rlgate.demo.agents:EitherSDKMathAgent", "agent_kwargs": {"model": "tiny-policy",
                                                                           "max_tokens": s.max_tokens},
        "steps": steps, "seed": 0, "checkpoint_every": steps, "keep_checkpoints": 1, "resume": False,
        "grpo": {"lr": s.lr, "groups_per_step": s.groups_per_step, "micro_batch_size": 32, "device": "cpu"},
        "rollout": {"group_size": s.group_size, "concurrency": s.concurrency, "seed": 0},
        "tracking": {"plot": False, "tensorboard": False, "stdout": False},
    }
    for section, values in VARIANTS[name].items():
        raw[section] = {**raw.get(section, {}), **values}
    return TrainConfig.model_validate(raw)


def run_variant(out: Path, warm: Path, name: str, steps: int) -> dict[str, Any]:
    """One variant in this process (called in a child): the row of the table."""
    import asyncio

    import torch

    from rlgate.train.run import Hooks, run_training

    torch.set_num_threads(max(1, torch.get_num_threads()))
    sizes: dict[str, int] = {}

    class Measure(Hooks):
        def on_end(self, run: Any) -> None:
            model, opt = run.trainer.model, run.trainer.optimizer
            params = list(model.parameters())
            sizes["params"] = sum(p.numel() for p in params)
            sizes["trainable"] = sum(p.numel() for p in params if p.requires_grad)
            sizes["weights_bytes"] = sum(p.numel() * p.element_size() for p in params)
            sizes["grads_bytes"] = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
            sizes["adam_bytes"] = sum(t.numel() * t.element_size() for st in opt.state.values()
                                      for t in st.values() if torch.is_tensor(t))

    cfg = config(out, warm, name, steps)
    t0 = time.perf_counter()
    result = asyncio.run(run_training(cfg, Measure(), stdout=False))
    wall = time.perf_counter() - t0
    history = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {"variant": name, "steps": steps, "accuracy_before": result["eval_start"],
            "accuracy_after": result["eval_end"], "train_s": statistics.fmean(h["train_s"] for h in history),
            "step_s": statistics.fmean(h["step_s"] for h in history), "wall_s": wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **sizes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="variants-out")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        print("ROW " + json.dumps(run_variant(out, out / "warm-start-math-seed0", args.child, args.steps)), flush=True)
        return
    prepare(out)
    rows = []
    for name in args.variants:
        proc = subprocess.run([sys.executable, __file__, "--out", str(out), "--steps", str(args.steps),
                               "--child", name], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        rows.append(json.loads(line[4:]))
        print(rows[-1], flush=True)
    base = rows[0]
    print("\n| variant | trainable params | weights + grads + AdamW | peak RSS | train part of a step | whole step "
          f"| held-out T=1 accuracy, before -> after {args.steps} steps |\n|---|---|---|---|---|---|---|")
    for r in rows:
        mem = (r["weights_bytes"] + r["grads_bytes"] + r["adam_bytes"]) / 2**20
        print(f"| {r['variant']} | {r['trainable']:,} ({100 * r['trainable'] / r['params']:.1f}%) | {mem:.1f} MiB | "
              f"{r['peak_rss_mb']:.0f} MB | {r['train_s']:.2f} s ({r['train_s'] / base['train_s']:.2f}x) | "
              f"{r['step_s']:.2f} s | {100 * r['accuracy_before']:.1f}% -> {100 * r['accuracy_after']:.1f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
