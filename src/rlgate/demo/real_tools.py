"""``rlgate demo --task tools`` on a real model: SmolLM2-135M-Instruct learns to use a calculator.

The task: "What is 347 * 582?" (three-digit products, which a 135M model cannot work out in its
head), with a ``calculator`` tool passed as real ``tools=`` by unmodified SDK agents
(``EitherSDKCalculatorAgent``: half the questions through the Anthropic SDK, half through the
OpenAI SDK; multi-turn, the tool run by the agent). Reward (``tool_round_reward``): 1 when the
final answer is right *and* a calculator call returned it before (a tool round), else 0; the
success rate below is the fraction of held-out episodes that score 1.

1. the model (``rlgate models fetch smollm2-135m-instruct`` first);
2. a short supervised warm start on the tool-call format (``demo/tool_sft.py``: a few dozen SFT
   steps on two-digit ``+`` / ``-`` questions, never a product; cached in
   ``OUT/warm-start-tools-seed<N>``): the raw model writes no tool call at all;
3. ``rlgate serve`` on the warm-started weights (local engine, 127.0.0.1, ``--device``);
4. held-out tool-round success before (greedy and T=1, with standard errors), GRPO on ``concat``
   samples (the whole conversation one sequence, loss on both replies), weights pushed after
   every step, held-out success after; ``reward_curve.png``, ``trajectories.parquet``,
   ``view.html`` (the viewer: ``rlgate view``), ``final/`` and ``summary.json``.
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

from rlgate.demo.calculator_agent import CALCULATOR_TOOL
from rlgate.demo.device import check_device
from rlgate.demo.rl import DemoHooks, DemoSettings, _read_history, _start_gateway, stop_gateway
from rlgate.demo.tasks import TaskSplit, multiply_task, tools_task
from rlgate.demo.tool_sft import tool_system_prompt, tool_warm_start
from rlgate.train.config import (
    DatasetSource,
    GatewaySettings,
    ModelSettings,
    RolloutSettings,
    TrackingSettings,
    TrainConfig,
)
from rlgate.train.grpo import GRPOConfig
from rlgate.train.run import TrainRun
from rlgate.trajectory.export import write_jsonl

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass
class RealToolsSettings(DemoSettings):
    """Sized for SmolLM2-135M-Instruct on 2 CPU cores (docs/training.md §6)."""

    # 4 steps: the call format is half learnt (first-turn right call on 24 held-out products: greedy 96%, T=1 21%;
    # 6 steps: 100% / 73%, 8 steps: 100% / 96%, and 24 steps left nothing for RL: 100% / 99% tool-round success)
    warm_start_steps: int = 4
    warm_start_lr: float = 3e-5
    warm_start_batch: int = 8
    warm_start_items: int = 480
    # 8 steps: the run fits in 20 minutes on 2 cores (seed 0 with 10 steps took 22.7; its train reward was 0.94 at
    # step 8 and 0.97 at step 10)
    steps: int = 8
    group_size: int = 8
    groups_per_step: int = 4
    lr: float = 3e-5
    # cosine decay to 0 at the last step: with a constant lr, seed 2 collapsed at step 7 (train reward 0.94 -> 0.0, a
    # one-character format slip everywhere): once nearly every episode scores 1 the gradient is mostly noise, and
    # AdamW takes a full-size step along it (2026-12-03)
    lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"
    max_tokens: int = 40
    max_turns: int = 3
    concurrency: int = 32
    eval_every: int = 10  # no evaluation mid-run at the default 8 steps (the reward per step is the curve)
    eval_items: int = 48
    eval_samples: int = 1
    final_eval_samples: int = 2
    episode_timeout: float = 600.0  # seconds; a 3-turn episode on a saturated 2-core machine took over 300
    dtype: str = "float32"
    # samples per forward+backward: the whole 32-sample batch at once (concat conversations of ~300 tokens, logits
    # over a 49k vocabulary) took the trainer past 22 GB and the OOM killer ended it on this 24 GB machine
    micro_batch_size: int = 8


def rate(result: Any) -> tuple[float, float]:
    """(fraction of episodes with reward 1: a tool round gave the right answer, standard error)."""
    rewards = [r if r is not None else 0.0 for item in result.per_item for r in item["rewards"]]
    n = max(len(rewards), 1)
    p = sum(1 for r in rewards if r >= 1.0) / n
    return p, math.sqrt(p * (1 - p) / n)


class ToolsDemoHooks(DemoHooks):
    """Tool-round success rate with standard errors (``table``), before and after."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.table: dict[str, dict[str, float]] = {}  # "before_t1" -> {success, success_se, episodes}
        self.model_label = "SmolLM2-135M-Instruct"

    async def accuracy(self, run: TrainRun, temperature: float = 1.0, samples: int | None = None) -> float:
        n = (samples or self.settings.eval_samples) if temperature > 0 else 1
        res = await run.evaluate(self.heldout, samples_per_item=n, temperature=temperature, record=False)
        p, se = rate(res)
        key = "after" if self.after or self.progress is not None else "before"
        self.table[f"{key}_{'t1' if temperature > 0 else 'greedy'}"] = {
            "success": p, "success_se": se, "episodes": res.episodes, "failed": res.failed}
        return p


def demo_config(settings: RealToolsSettings, *, model_dir: Path, out: Path, url: str, admin_key: str, seed: int,
                system: str, device: str) -> TrainConfig:
    return TrainConfig(
        model=str(model_dir), out_dir=str(out), dataset=DatasetSource(path=str(out / "multiply-train.jsonl")),
        agent="rlgate.demo.agents:EitherSDKCalculatorAgent",
        agent_kwargs={"model": "policy", "max_tokens": settings.max_tokens, "max_turns": settings.max_turns,
                      "system": system, "reward": "tool_round"},
        steps=settings.steps, seed=seed, checkpoint_every=settings.steps or 1, keep_checkpoints=1, resume=False,
        grpo=GRPOConfig(lr=settings.lr, lr_schedule=settings.lr_schedule, groups_per_step=settings.groups_per_step,
                        max_staleness=0,
                        scale_adv_by_std=False, micro_batch_size=settings.micro_batch_size, pad_token_id=0,
                        device=device),
        train=ModelSettings(dtype="bfloat16" if settings.dtype == "bfloat16" else "float32"),
        rollout=RolloutSettings(group_size=settings.group_size, concurrency=settings.concurrency,
                                episode_timeout=settings.episode_timeout, export_style="concat"),
        gateway=GatewaySettings(url=url, admin_key=admin_key, sync_dir=str(out / "sync"), sync_keep=1),
        tracking=TrackingSettings(trajectories=False, plot=False),
    )


def chain_stats(samples: list[Any]) -> dict[str, Any]:
    """How the trained samples were recorded: forks (0: every conversation one token chain), chains
    of two turns or more (a tool round), the silent-failure flags."""
    flags: dict[str, int] = {}
    for s in samples:
        for f in s.flags:
            flags[f] = flags.get(f, 0) + 1
    return {"samples": len(samples), "forks": sum(1 for s in samples if s.relation == "fork"),
            "tool_rounds": sum(1 for s in samples if len(s.chain or []) >= 2), "flags": flags}


def example(samples: list[Any], tokenizer: Any, reward: float) -> str | None:
    """The text of the last trained sample with ``reward`` from its first generated token on."""
    for s in reversed(samples):
        if s.reward == reward and 1 in s.loss_mask:
            return str(tokenizer.decode(s.input_ids[s.loss_mask.index(1):]))
    return None


async def _train(url: str, admin_key: str, model_dir: Path, out: Path, split: TaskSplit, settings: RealToolsSettings,
                 seed: int, system: str, device: str, console: Any) -> tuple[dict[str, Any], list[Any]]:
    from rlgate.train.run import run_training

    write_jsonl(split.train, out / "multiply-train.jsonl")
    cfg = demo_config(settings, model_dir=model_dir, out=out, url=url, admin_key=admin_key, seed=seed,
                      system=system, device=device)
    hooks = ToolsDemoHooks("tools", split.heldout[: settings.eval_items], settings, console, model_dir)
    result = await run_training(cfg, hooks, stdout=False)
    history = _read_history(out)
    rollout_s = sum(h["rollout_s"] for h in history)
    train_s = sum(h["train_s"] + h["sync_s"] for h in history)
    return {
        "accuracy_metric": "tool-round success: fraction of held-out episodes whose final answer is right and "
                           "was returned by a calculator call",
        "table": hooks.table, "evals": hooks.evals, "steps": result["steps"], "history": history,
        "reward_per_step": [h["reward"] for h in history],
        "rollout_seconds": rollout_s, "train_seconds": train_s,
        "rollout_fraction": rollout_s / max(rollout_s + train_s, 1e-9),
    }, hooks.samples


def run_real_tools_demo(out: Path, *, model: str = DEFAULT_MODEL, seed: int = 0, steps: int | None = None,
                        overrides: dict[str, Any] | None = None, port: int | None = None,
                        device: str = "cpu") -> int:
    from rich.console import Console

    from rlgate.checkpoints import ModelNotFound, resolve_model

    device = check_device(device)
    console = Console(soft_wrap=True)  # no hard wrap at 80 columns when the output is not a terminal
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    settings = RealToolsSettings()
    if steps is not None:
        settings.steps = steps
    for key, value in (overrides or {}).items():
        setattr(settings, key, value)
    console.rule(f"[bold]rlgate demo[/bold] — {model}, task 'tools' (3-digit products, calculator), seed {seed}, "
                 f"{device}")
    try:
        model_dir = resolve_model(model)
    except ModelNotFound as exc:
        raise SystemExit(f"rlgate: {exc}") from None
    t_model = time.perf_counter() - t_start
    tool = dict(CALCULATOR_TOOL)
    system = tool_system_prompt([tool])
    split = multiply_task(seed=0)  # the same split for every seed
    warm_dir = out / f"warm-start-tools-seed{seed}"
    sft_items = tools_task(seed=0).train[: settings.warm_start_items]  # 2-digit + / -: the format, not products
    ws = tool_warm_start(model_dir, warm_dir, sft_items, system=system, tool=tool, steps=settings.warm_start_steps,
                         seed=seed, lr=settings.warm_start_lr, batch_size=settings.warm_start_batch,
                         log=lambda msg: console.print(f"[dim]{msg}[/dim]"))
    admin_key = secrets.token_urlsafe(32)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    proc, url = _start_gateway(warm_dir, admin_key, out / "gateway.log", port, device=device)
    console.print(f"gateway on {url} (local engine on {device}, {model} warm-started: {warm_dir.name})")
    try:
        result, samples = asyncio.run(_train(url, admin_key, warm_dir, out, split, settings, seed, system, device,
                                             console))
    finally:
        stop_gateway(proc)
    table = result["table"]

    def cell(key: str) -> str:
        row = table.get(key, {})
        return f"{row.get('success', 0):.0%} ± {row.get('success_se', 0):.0%}"

    console.print(f"held-out tool-round success: greedy {cell('before_greedy')} -> {cell('after_greedy')}; "
                  f"T=1 {cell('before_t1')} -> {cell('after_t1')}")
    from rlgate.model import load_tokenizer

    tokenizer = load_tokenizer(warm_dir)
    result["chains"] = chain_stats(samples)
    for reward, label in ((1.0, "a tool round that scored 1"), (0.0, "an episode that scored 0")):
        text = example(samples, tokenizer, reward)
        if text is not None:
            console.print(f"[dim]{label} (the last trained one; generated and tool tokens):[/dim]\n{text}")
    console.print(f"trained samples: {result['chains']}")
    view = _write_view(out, tokenizer, console)
    wall = time.perf_counter() - t_start
    summary = {"task": "tools-multiply", "model": model, "seed": seed, "device": device, "wall_seconds": wall,
               "model_seconds": t_model, "warm_start": ws, "system_prompt": system, "settings": settings.__dict__,
               **result}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    console.print(f"wrote {out / 'summary.json'}, {out / 'reward_curve.png'}, {out / 'trajectories.parquet'}, "
                  f"{view or '(no viewer file)'}, {out / 'final'}  ({wall:.0f} s)")
    return 0


def _write_view(out: Path, tokenizer: Any, console: Any) -> Path | None:
    """``OUT/view.html``: the trained samples in the trajectory viewer (as ``rlgate view`` writes it)."""
    from rlgate.ui.static_export import write_view

    try:
        path, _ = write_view([out / "trajectories.parquet"], out / "view.html", tokenizer=tokenizer,
                               title="rlgate demo — tools on SmolLM2-135M-Instruct", max_sessions=200)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        console.print(f"[dim]no viewer file: {exc}[/dim]")
        return None
    return path
