"""rlgate's GRPO loop against TRL's ``GRPOTrainer``, side by side, on the demo's math task.

    python benchmarks/vs_trl.py --out /tmp/vs-trl --steps 30                      # toy, 3 seeds
    python benchmarks/vs_trl.py --out /tmp/vs-trl --model smollm2 --steps 8
    python benchmarks/vs_trl.py --out /tmp/vs-trl --sides rlgate rlgate-async trl --seeds 0

Both sides start from the same weights (toy: the demo's supervised warm start of the tiny model,
cached in ``--out``; ``smollm2``: SmolLM2-135M-Instruct as ``rlgate models fetch`` converted it, no
warm start), train on the same prompts with the same reward for ``--steps`` steps of
``groups`` prompts × ``group_size`` completions of at most ``max_tokens`` new tokens at T = 1,
with the same learning rate (constant), no KL, AdamW, gradient clipping 1.0, token-level loss
normalisation (TRL's ``dapo``, rlgate's only one), advantages mean-centred without std scaling,
one update per batch, gradient checkpointing off:

* ``trl``: TRL's ``GRPOTrainer`` with its own generation (``model.generate`` in the trainer);
  the prompt is the one user message rendered by the checkpoint's chat template (checked to be
  the very token ids the gateway renders);
* ``rlgate``: ``rlgate train`` (``run_training``: in-process gateway, the demo's unmodified SDK
  agents, half Anthropic and half OpenAI, over HTTP on 127.0.0.1), on-policy (``max_staleness 0``);
* ``rlgate-async``: the same with ``max_staleness 1``: rollout of the next step overlaps the
  training step (off-policy tokens corrected by the recorded behaviour logprobs);
* ``trl-rlgate`` (not run by default): TRL's ``GRPOTrainer`` with ``rlgate.integrations.trl``
  playing the episodes through the gateway. Each row also gives the per-step mean entropy.

Each (side, seed) runs in its own child process, sides interleaved seed by seed so that the
machine's load falls on all of them alike. Per run: the median step time over steps 6..N and its
rollout / train split (TRL: generation + scoring vs the rest of the step), generated tokens per
second of step time, the loop's wall time (sum of step times) and CPU time per step (the process's
``time.process_time``, every thread: on a shared machine the work done, which the load does not
inflate as it does wall time), and held-out greedy accuracy
before and after (the same evaluation for both: ``model.generate`` greedy on the held-out
questions, reward 1.0 = right). Prints a Markdown table; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SIDES = ("rlgate", "rlgate-async", "trl")
# not run by default: ``rlgate`` with the four control calls per episode of before issue 28's change
# (start_session, end_session, set_reward, export each on its own; the runner's batch_starts and
# fused_finish off), for a before/after in one run: --sides rlgate rlgate-4calls
# ``trl-rlgate``: TRL's GRPOTrainer (its loss, optimiser, sampler of prompts) with rlgate playing the
# episodes (``rlgate.integrations.trl.TRLRollout``: the SDK agents through the gateway and the engine):
# the adapter a TRL user would run, and the bisection between the two loops
EXTRA_SIDES = ("rlgate-4calls", "trl-rlgate")


def settings(model: str, task: str = "compare") -> dict[str, Any]:
    if model == "smollm2":  # the real-model demo's settings (demo/real.py)
        s = {"groups": 4, "group_size": 8, "lr": 5e-5, "max_tokens": 8, "eval_items": 100}
        return {**s, "max_tokens": 12} if task == "sum" else s
    return {"groups": 8, "group_size": 8, "lr": 1e-4, "max_tokens": 8, "eval_items": 200}


def prepare(out: Path, model: str, task: str = "compare", train_reward: str = "number",
            ) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
    """The starting checkpoint, the training items and the held-out items."""
    from rlgate.demo.tasks import TASKS

    if model == "smollm2":
        from rlgate.demo.real import DEFAULT_MODEL, real_task
        from rlgate.demo.tasks import sum_task
        from rlgate.train.loading import resolve_model

        split = (sum_task(seed=0) if task == "sum"
                 else real_task(seed=0, kinds=("larger",), train_reward=train_reward) if task == "larger"
                 else real_task(seed=0, train_reward=train_reward))
        return resolve_model(DEFAULT_MODEL), split.train, split.heldout[:settings(model)["eval_items"]]
    from rlgate.demo.rl import DemoSettings
    from rlgate.demo.scripted import ensure_tiny_model
    from rlgate.demo.sft import warm_start

    s = DemoSettings.for_task("math")
    base = ensure_tiny_model(out)
    split = TASKS["math"](seed=0)
    validation = split.train[:s.validation_items]
    warm = out / "warm-start-math-seed0"
    warm_start(base, warm, split.train[len(validation):], task="math", steps=s.warm_start_steps, seed=0,
               lr=s.warm_start_lr, batch_size=s.warm_start_batch, target_accuracy=s.warm_start_target,
               validation=validation, check_every=s.check_every, log=print)
    return warm, split.train, split.heldout[:s.eval_items]


def prompt_ids(model_dir: Path, items: list[dict[str, Any]]) -> list[list[int]]:
    """Each item's one user message as the gateway renders it (token ids)."""
    from rlgate.chat.conversation import Message
    from rlgate.chat.render import ChatRenderer
    from rlgate.model import load_tokenizer

    renderer = ChatRenderer(load_tokenizer(model_dir))
    return [renderer.render_ids([Message.of("user", it["question"])]) for it in items]


def greedy_scores(model: Any, model_dir: Path, items: list[dict[str, Any]], max_tokens: int) -> dict[str, float]:
    """Greedy held-out scores: ``exact`` the fraction of replies earning reward 1.0 (the agents' own
    reward: the format and the skill), ``right`` the fraction earning > 0 (the right answer in any form:
    the skill), ``reward`` the mean reward."""
    from rlgate.chat.render import ChatRenderer
    from rlgate.demo.math_agent import reward_for
    from rlgate.demo.sft import greedy_texts
    from rlgate.model import load_tokenizer, stop_token_ids

    tok = load_tokenizer(model_dir)
    texts = greedy_texts(model, ChatRenderer(tok), prompt_ids(model_dir, items), stop_token_ids(tok, model_dir),
                         max_new_tokens=max_tokens, batch_size=50)
    rewards = [reward_for(it)(t, it["answer"]) for t, it in zip(texts, items, strict=True)]
    n = max(len(rewards), 1)
    return {"exact": sum(r >= 1.0 for r in rewards) / n, "right": sum(r > 0 for r in rewards) / n,
            "reward": sum(rewards) / n}


# ---------------------------------------------------------------------------------- rlgate


def run_rlgate(out: Path, model_dir: Path, train: list[dict[str, Any]], heldout: list[dict[str, Any]],
               model: str, seed: int, steps: int, staleness: int, extra: dict[str, Any],
               four_calls: bool = False, eval_every: int = 0, task: str = "compare") -> dict[str, Any]:
    import asyncio

    from rlgate.train.config import TrainConfig
    from rlgate.train.run import Hooks, run_training
    from rlgate.trajectory.export import write_jsonl

    s = settings(model, task)
    run_dir = out / f"run-rlgate-s{staleness}-{model}-{task}-seed{seed}"
    data = out / f"{model}-{task}-train-seed{seed}.jsonl"  # one per run: runs may go on side by side
    write_jsonl(train, data)
    raw: dict[str, Any] = {
        "model": str(model_dir), "out_dir": str(run_dir), "dataset": str(data),
        "agent": "rlgate.demo.agents:EitherSDKMathAgent",
        "agent_kwargs": {"model": "policy", "max_tokens": s["max_tokens"]},
        "steps": steps, "seed": seed, "checkpoint_every": 10**6, "keep_checkpoints": 1, "resume": False,
        "grpo": {"lr": s["lr"], "groups_per_step": s["groups"], "micro_batch_size": 64, "device": "cpu",
                 "max_staleness": staleness, "pad_token_id": 0},
        "rollout": {"group_size": s["group_size"], "concurrency": s["groups"] * s["group_size"], "seed": seed,
                    "batch_starts": not four_calls, "fused_finish": not four_calls},
        "tracking": {"plot": False, "tensorboard": False, "stdout": False},
    }
    for section, values in extra.items():
        raw[section] = {**raw.get(section, {}), **values} if isinstance(values, dict) else values
    cfg = TrainConfig.model_validate(raw)
    curve = Curve(model_dir, heldout, s["max_tokens"], eval_every)

    class Measure(Hooks):
        def on_start(self, run: Any) -> None:
            curve.measure(run.trainer.model, 0)
            curve.start()

        def on_step(self, run: Any, result: Any) -> None:
            step = int(result.metrics["step"])
            if step < steps:
                curve.maybe_measure(run.trainer.model, step)

        def on_end(self, run: Any) -> None:
            curve.stop()
            curve.measure(run.trainer.model, steps)

    asyncio.run(run_training(cfg, Measure(), stdout=False))
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"history": [{"step_s": h["step_s"], "rollout_s": h["rollout_s"], "train_s": h["train_s"] + h["sync_s"],
                         "tokens": h["generated_tokens"], "reward": h["reward"], "entropy": h.get("entropy"),
                         "zero_var_groups": h.get("zero_variance_groups"), "grad_norm": h.get("grad_norm")}
                        for h in history], **curve.result()}


class Curve:
    """Held-out greedy scores at step 0, every ``every`` steps and at the end, against the loop's own
    wall and CPU time so far (the evaluations' time left out)."""

    def __init__(self, model_dir: Path, heldout: list[dict[str, Any]], max_tokens: int, every: int) -> None:
        self.model_dir, self.heldout, self.max_tokens, self.every = model_dir, heldout, max_tokens, every
        self.points: list[dict[str, Any]] = []
        self.paused_wall = self.paused_cpu = 0.0
        self.t0 = self.cpu0 = 0.0
        self.wall = self.cpu = 0.0

    def start(self) -> None:
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self.t0 - self.paused_wall
        self.cpu = time.process_time() - self.cpu0 - self.paused_cpu

    def maybe_measure(self, model: Any, step: int) -> None:
        if self.every and step % self.every == 0:
            self.measure(model, step)

    def measure(self, model: Any, step: int) -> None:
        w0, c0 = time.perf_counter(), time.process_time()
        scores = greedy_scores(model, self.model_dir, self.heldout, self.max_tokens)
        if self.t0 and not self.wall:  # during the loop: its time so far, then pause the clock
            wall = w0 - self.t0 - self.paused_wall
            cpu = c0 - self.cpu0 - self.paused_cpu
            self.paused_wall += time.perf_counter() - w0
            self.paused_cpu += time.process_time() - c0
        else:
            wall, cpu = (self.wall, self.cpu) if self.wall else (0.0, 0.0)
        self.points.append({"step": step, "wall_s": wall, "cpu_s": cpu, **scores})

    def result(self) -> dict[str, Any]:
        return {"curve": self.points, "accuracy_before": self.points[0]["exact"],
                "accuracy_after": self.points[-1]["exact"], "loop_wall_s": self.wall, "loop_cpu_s": self.cpu}


# ---------------------------------------------------------------------------------- TRL


def run_trl(out: Path, model_dir: Path, train: list[dict[str, Any]], heldout: list[dict[str, Any]],
            model: str, seed: int, steps: int, rlgate_rollout: bool = False, eval_every: int = 0,
            task: str = "compare", lora: int = 0, lr: float | None = None, mixed: bool = False,
            clip_high: float | None = None, cut_replies: bool = False) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlgate.demo.math_agent import reward_for
    from rlgate.model import load_tokenizer, stop_token_ids

    s = settings(model, task)
    tok = load_tokenizer(model_dir)
    stops = stop_token_ids(tok, model_dir)
    # the prompt TRL sends to generate: the chat template's text, the same ids the gateway renders
    texts = [tok.apply_chat_template([{"role": "user", "content": it["question"]}], tokenize=False,
                                     add_generation_prompt=True) for it in train[:50]]
    want = prompt_ids(model_dir, train[:50])
    got_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    if got_ids != want:
        raise SystemExit("TRL's prompt ids differ from the gateway's: the comparison would not be fair")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": it["question"]}], "answer": it["answer"],
                               "format": it.get("format", "")} for it in train])
    rollout: Any = None
    if rlgate_rollout:  # the prompt column is the question; the episode's data is looked up by it
        from rlgate.demo.agents import EitherSDKMathAgent
        from rlgate.integrations.trl import TRLRollout
        from rlgate.train.config import RolloutSettings

        by_question = {it["question"]: it for it in train}
        data = Dataset.from_list([{"prompt": it["question"]} for it in train])
        rollout = TRLRollout.start(EitherSDKMathAgent(model="policy", max_tokens=s["max_tokens"]), model_dir,
                                   data_for=by_question.__getitem__, out_dir=out / f"trl-rlgate-{seed}",
                                   rollout=RolloutSettings(seed=seed, concurrency=s["groups"] * s["group_size"]))

    def reward(completions: list[Any], answer: list[str], format: list[str], **kw: Any) -> list[float | None]:  # noqa: A002
        out: list[float | None] = []
        ids = kw.get("completion_ids") or [None] * len(completions)
        for c, a, f, c_ids in zip(completions, answer, format, ids, strict=True):
            text = c[0]["content"] if isinstance(c, list) else c
            cut = c_ids is not None and len(c_ids) >= s["max_tokens"] and (not c_ids or c_ids[-1] not in stops)
            out.append(0.0 if cut_replies and cut else reward_for({"format": f})(text, a))
        return out

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    curve = Curve(model_dir, heldout, s["max_tokens"], eval_every)
    curve.measure(policy, 0)
    n = s["groups"] * s["group_size"]
    args = GRPOConfig(
        output_dir=str(out / f"run-trl-{model}-{task}-seed{seed}"), max_steps=steps, learning_rate=lr or s["lr"],
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch",
        per_device_train_batch_size=n, num_generations=s["group_size"], gradient_accumulation_steps=1,
        max_completion_length=s["max_tokens"], temperature=1.0, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2,
        loss_type="dapo", scale_rewards="none", num_iterations=1, gradient_checkpointing=False,
        disable_dropout=True, use_cpu=True, bf16=mixed, report_to="none", save_strategy="no", logging_steps=1,
        seed=seed, data_seed=seed, generation_kwargs={"eos_token_id": stops},
        # clip-higher; cut replies are scored 0 by the reward function above (rlgate's grpo.truncated_reward 0):
        # TRL's own mask_truncated_completions leaves them out of the loss, which on this task (the base model's
        # replies are nearly all prose cut at 8 tokens) left seed 0 no signal at all: 0% after 12 steps
        **({"epsilon_high": clip_high} if clip_high is not None else {}),
    )
    times: dict[str, list[float]] = {"gen": [], "step": []}

    class Trainer(GRPOTrainer):
        def _generate_and_score_completions(self, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **k)
            finally:
                times["gen"].append(time.perf_counter() - t)

    class Clock(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **k: Any) -> None:
            times["step"].append(time.perf_counter() - self.t)
            if state.global_step < steps:
                curve.maybe_measure(k["model"], state.global_step)

    peft: dict[str, Any] = {}
    if lora:  # the same adapters as rlgate's train.lora: every linear layer but the output, alpha = 2r
        from peft import LoraConfig

        peft["peft_config"] = LoraConfig(r=lora, lora_alpha=2 * lora, target_modules="all-linear",
                                         task_type="CAUSAL_LM")
    if rollout is not None:
        from rlgate.integrations.trl import agent_reward

        trainer = Trainer(model=policy, reward_funcs=agent_reward, args=args, train_dataset=data,
                          processing_class=tok, callbacks=[Clock()], rollout_func=rollout, **peft)
    else:
        trainer = Trainer(model=policy, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()], **peft)
    curve.start()
    try:
        trainer.train()
    finally:
        if rollout is not None:
            rollout.close()
    curve.stop()
    curve.measure(trainer.model, steps)
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    history = [{"step_s": st, "rollout_s": g, "train_s": st - g, "tokens": lg["completions/mean_length"] * n,
                "reward": lg["reward"], "entropy": lg.get("entropy"),
                "zero_var_groups": round(lg.get("frac_reward_zero_std", 0.0) * s["groups"]),
                "grad_norm": lg.get("grad_norm")}
               for st, g, lg in zip(times["step"], times["gen"], logs, strict=False)]
    return {"history": history, **curve.result()}


# ---------------------------------------------------------------------------------- driver


def summarise(side: str, seed: int, res: dict[str, Any]) -> dict[str, Any]:
    h = res["history"]
    tail = h[5:] if len(h) > 6 else h
    med = statistics.median(x["step_s"] for x in tail)
    return {"side": side, "seed": seed, "steps": len(h), "step_s": med,
            "rollout_s": statistics.median(x["rollout_s"] for x in tail),
            "train_s": statistics.median(x["train_s"] for x in tail),
            "tokens_per_s": sum(x["tokens"] for x in h) / max(sum(x["step_s"] for x in h), 1e-9),
            "loop_s": sum(x["step_s"] for x in h), "cpu_s_per_step": res["loop_cpu_s"] / max(len(h), 1),
            "accuracy_before": res["accuracy_before"],
            "accuracy_after": res["accuracy_after"], "reward_last5": statistics.fmean(x["reward"] for x in h[-5:]),
            "rewards": [round(x["reward"], 3) for x in h],
            "entropy": [None if x.get("entropy") is None else round(x["entropy"], 2) for x in h],
            "zero_var_groups": [x.get("zero_var_groups") for x in h],
            "curve": res["curve"]}


def child(args: argparse.Namespace, out: Path) -> None:
    import torch

    torch.manual_seed(args.seed)
    model_dir, train, heldout = prepare(out, args.model, args.task, args.train_reward)
    extra = json.loads(args.extra) if args.extra else {}
    if args.lora:  # both sides: LoRA on every linear layer but the output, alpha = 2r
        extra.setdefault("train", {})["lora"] = {"r": args.lora, "alpha": 2 * args.lora}
    if args.mixed:
        extra.setdefault("train", {})["dtype"] = "mixed"
    if args.lr:
        extra.setdefault("grpo", {})["lr"] = args.lr
    if args.clip_high is not None:
        extra.setdefault("grpo", {})["clip_high"] = args.clip_high
    if args.cut_replies:
        extra.setdefault("grpo", {})["truncated_reward"] = 0.0
    if args.child in ("trl", "trl-rlgate"):
        res = run_trl(out, model_dir, train, heldout, args.model, args.seed, args.steps,
                      rlgate_rollout=args.child == "trl-rlgate", eval_every=args.eval_every, task=args.task,
                      lora=args.lora, lr=args.lr, mixed=args.mixed, clip_high=args.clip_high,
                      cut_replies=args.cut_replies)
    else:
        res = run_rlgate(out, model_dir, train, heldout, args.model, args.seed, args.steps,
                         1 if args.child == "rlgate-async" else 0, extra, four_calls=args.child == "rlgate-4calls",
                         eval_every=args.eval_every, task=args.task)
    print("ROW " + json.dumps(summarise(args.child, args.seed, res)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="vs-trl-out")
    ap.add_argument("--model", choices=("toy", "smollm2"), default="toy")
    ap.add_argument("--task", choices=("compare", "larger", "sum"), default="compare",
                    help="smollm2: 'Which is larger/smaller...' with the format reward ('larger': larger only), or "
                    "'What is 37 + 48?' with partial credit")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES + EXTRA_SIDES)
    ap.add_argument("--extra", default=None, help="JSON merged into the rlgate TrainConfig (e.g. levers)")
    ap.add_argument("--lora", type=int, default=0, help="both sides: LoRA adapters of this rank (alpha 2r) on "
                    "every linear layer but the output (0: every weight)")
    ap.add_argument("--lr", type=float, default=None, help="both sides: this learning rate (default: the task's)")
    ap.add_argument("--mixed", action="store_true", help="both sides: bfloat16 compute, float32 weights "
                    "(rlgate train.dtype mixed, TRL bf16=True)")
    ap.add_argument("--clip-high", type=float, default=None, help="both sides: DAPO's clip-higher upper bound "
                    "(rlgate grpo.clip_high, TRL epsilon_high)")
    ap.add_argument("--cut-replies", action="store_true", help="both sides: a reply cut at max_tokens scores 0 "
                    "(rlgate grpo.truncated_reward 0; TRL: the reward function, from the completion's ids)")
    ap.add_argument("--train-reward", choices=("number", "number-first"), default="number",
                    help="smollm2 compare / larger: the training items' reward (held-out items keep 'number')")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="held-out greedy evaluation every N steps too (0: before and after only)")
    ap.add_argument("--label", default=None, help="the rows' side name (default: the side), e.g. for a lever")
    ap.add_argument("--json", default=None, help="append the rows here (JSON lines): benchmarks/learning.py reads them")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args, out)
        return
    prepare(out, args.model, args.task, args.train_reward)  # the warm start, once, before any timing
    rows = []
    for seed in args.seeds:
        for side in args.sides:
            cmd = [sys.executable, __file__, "--out", str(out), "--model", args.model, "--steps", str(args.steps),
                   "--child", side, "--seed", str(seed), "--eval-every", str(args.eval_every), "--task", args.task]
            cmd += ["--extra", args.extra] if args.extra else []
            cmd += ["--lora", str(args.lora)] + (["--lr", str(args.lr)] if args.lr else []) + (["--mixed"] if args.mixed else [])
            cmd += (["--clip-high", str(args.clip_high)] if args.clip_high is not None else []) + \
                (["--cut-replies"] if args.cut_replies else []) + ["--train-reward", args.train_reward]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("ROW ")), None)
            if line is None:
                raise SystemExit(f"{side} seed {seed} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
            row = {**json.loads(line[4:]), "load": os.getloadavg()[0], "model": args.model,
                   "task": args.task, "settings": {**settings(args.model, args.task), "lora": args.lora,
                                                   "mixed": args.mixed, **({"lr": args.lr} if args.lr else {}),
                                                   "clip_high": args.clip_high, "cut_replies": args.cut_replies,
                                                   "train_reward": args.train_reward},
                   "extra": args.extra}
            if args.label:
                row["side"] = args.label if len(args.sides) == 1 else f"{args.label}-{side}"
            rows.append(row)
            print({k: v for k, v in row.items() if k != "curve"}, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(f"\n{args.model} {args.task}, {args.steps} steps, {settings(args.model, args.task)}\n")
    print("| side | seed | s/step (median 6..N) | rollout s | train s | CPU s/step | gen tok/s | loop wall s | "
          "held-out greedy before -> after | load |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['side']} | {r['seed']} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['train_s']:.2f} | "
              f"{r['cpu_s_per_step']:.2f} | {r['tokens_per_s']:.0f} | {r['loop_s']:.1f} | {100 * r['accuracy_before']:.1f}% -> "
              f"{100 * r['accuracy_after']:.1f}% | {r['load']:.1f} |")


if __name__ == "__main__":
    main()
