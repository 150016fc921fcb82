"""``rlgate demo``: unmodified SDK agents improving through RL, offline, on a CPU.

1. build the tiny model (cached in ``OUT/model``);
2. supervised warm start on a synthetic task, stopped while the model is mediocre
   (cached in ``OUT/warm-start-<task>-seed<N>``);
3. start ``rlgate serve`` on 127.0.0.1 (a subprocess, local engine, ``granted`` capacity)
   serving the warm-started weights;
4. measure held-out accuracy through the agents: the fraction of held-out questions the
   policy answers correctly with one sample at the training temperature (T=1, the
   quantity GRPO optimises), and greedy accuracy alongside;
5. GRPO: groups of episodes played by the example agents — for ``math`` half the groups
   use the Anthropic SDK ``MathAgent``, half its OpenAI SDK twin; for ``tools`` the
   multi-turn ``CalculatorAgent`` (trained on ``concat`` trajectories) — with weights
   pushed to the gateway after every step (safetensors + ``/rl/update_weights``);
6. measure held-out accuracy again; write ``reward_curve.png``, ``trajectories.parquet``,
   the final checkpoint (``OUT/final``) and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlgate.demo.scripted import ensure_tiny_model
from rlgate.demo.sft import warm_start
from rlgate.demo.tasks import TASKS
from rlgate.trajectory.export import ExportStyle


@dataclass
class DemoSettings:
    """Defaults tuned so that the demo fits in 10 minutes on 2 CPU cores."""

    warm_start_steps: int = 300  # at most; math stops once validation accuracy reaches the target
    warm_start_lr: float = 1e-3
    warm_start_target: float | None = 0.65  # greedy accuracy on a validation split of the train items
    warm_start_batch: int = 64
    validation_items: int = 200  # taken from the train items, not trained on by the warm start
    check_every: int = 10  # warm-start steps between validation checks
    steps: int = 200
    group_size: int = 8
    groups_per_step: int = 8
    lr: float = 1e-4
    scale_adv_by_std: bool = False
    max_tokens: int = 8
    concurrency: int = 64
    eval_every: int = 20
    eval_items: int = 200
    eval_samples: int = 2  # samples per held-out question at T=1 during training (the curve)
    final_eval_samples: int = 4  # ... for accuracy before / after (4 x 200: standard error ~1.7 points)
    max_staleness: int = 0

    @classmethod
    def for_task(cls, task: str) -> DemoSettings:
        if task == "tools":
            return cls(warm_start_steps=300, warm_start_target=0.5, warm_start_batch=32, validation_items=64,
                       check_every=25, steps=40, group_size=6, groups_per_step=6, max_tokens=48, concurrency=36,
                       eval_items=100, eval_samples=1, final_eval_samples=2)
        return cls()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_gateway(model_dir: Path, admin_key: str, log_path: Path,
                   metrics_port: int | None = None) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    log_file = log_path.open("w")
    extra = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model_dir), "--engine", "local",
         "--host", "127.0.0.1", "--port", str(port), "--capacity-mode", "granted", "--log-level", "warning",
         "--model-name", "tiny-policy", "--store", ":memory:", *extra],
        env={**os.environ, "RLGATE_ADMIN_KEY": admin_key},  # not on the command line (ps shows argv)
        stdout=log_file, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited early; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"the gateway did not start; see {log_path}")


def _agent_factory(task: str, max_tokens: int):
    if task == "tools":
        from rlgate.demo.calculator_agent import CalculatorAgent

        agent = CalculatorAgent(model="tiny-policy", max_tokens=max_tokens)
        return lambda gid, data: agent
    from rlgate.demo.math_agent import MathAgent, OpenAIMathAgent

    anthropic_agent = MathAgent(model="tiny-policy", max_tokens=max_tokens)
    openai_agent = OpenAIMathAgent(model="tiny-policy", max_tokens=max_tokens)
    # half the groups (by index) use the Anthropic SDK, half the OpenAI SDK
    return lambda gid, data: anthropic_agent if int(gid.rsplit("-", 1)[-1]) % 2 == 0 else openai_agent


def _plot(path: Path, history: list[dict[str, float]], evals: list[tuple[int, float]], task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    steps = [h["step"] for h in history]
    rewards = [h["reward"] for h in history]
    ax.plot(steps, rewards, label="train reward per step (T=1)", color="tab:blue", alpha=0.35)
    window = 5
    smooth = [sum(rewards[max(0, i - window + 1):i + 1]) / len(rewards[max(0, i - window + 1):i + 1])
              for i in range(len(rewards))]
    ax.plot(steps, smooth, label=f"train reward, {window}-step mean", color="tab:blue")
    ax.plot([s for s, _ in evals], [a for _, a in evals], "o-", label="held-out accuracy (T=1)",
            color="tab:orange")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"rlgate demo — task '{task}', tiny model on CPU")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


async def _train(url: str, admin_key: str, model_dir: Path, out: Path, task: str, split: Any,
                 settings: DemoSettings, seed: int, console: Any, exporter: Any = None) -> dict[str, Any]:
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import AutoModelForCausalLM

    from rlgate.client import GatewayClient
    from rlgate.rollout.runner import RolloutRunner
    from rlgate.train.grpo import GRPOConfig, GRPOTrainer, LoopState, grpo_loop
    from rlgate.train.sync import RemoteSync
    from rlgate.trajectory.export import write_parquet

    torch.manual_seed(seed)
    rng = random.Random(seed)
    client = GatewayClient(url, admin_key)
    style: ExportStyle = "concat" if task == "tools" else "individual"
    runner = RolloutRunner(client, _agent_factory(task, settings.max_tokens), group_size=settings.group_size,
                           concurrency=settings.concurrency, episode_timeout=60, export_style=style)
    heldout = split.heldout[: settings.eval_items]

    async def accuracy(temperature: float = 1.0, samples: int | None = None) -> float:
        """Fraction of held-out questions answered right by the policy (mean over samples)."""
        n = (samples or settings.eval_samples) if temperature > 0 else 1
        items = [{**d, "temperature": temperature} for d in heldout for _ in range(n)]
        episodes = await runner.evaluate(items, group_id="eval")
        return sum(e.reward or 0.0 for e in episodes) / len(episodes)

    t0 = time.perf_counter()
    acc_before = await accuracy(samples=settings.final_eval_samples)
    greedy_before = await accuracy(0.0)
    t_eval = time.perf_counter() - t0
    console.print(f"held-out accuracy before RL: [bold]{acc_before:.1%}[/bold] at the training temperature "
                  f"(T=1), {greedy_before:.1%} greedy ({len(heldout)} questions, {t_eval:.1f} s)")

    def prompts():
        i = 0
        while True:
            items = list(split.train)
            rng.shuffle(items)
            for d in items:
                yield f"g-{i}", {**d, "temperature": 1.0}
                i += 1

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = GRPOConfig(lr=settings.lr, groups_per_step=settings.groups_per_step, max_staleness=settings.max_staleness,
                        scale_adv_by_std=settings.scale_adv_by_std, micro_batch_size=32, pad_token_id=0, device="cpu")
    trainer = GRPOTrainer(model, config)
    sync = RemoteSync(client, out / "sync", keep=1)
    all_samples: list[dict[str, Any]] = []
    evals: list[tuple[int, float]] = [(0, acc_before)]
    last_acc = acc_before
    original_step = trainer.step

    def recording_step(samples, group_ids, version):
        for s, g in zip(samples, group_ids, strict=False):
            all_samples.append({**s, "group": g, "train_version": version})
        return original_step(samples, group_ids, version)

    trainer.step = recording_step  # type: ignore[method-assign]
    columns = [TextColumn("[bold]GRPO[/bold]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.description}"), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("starting", total=settings.steps)

        async def on_step(state: LoopState, m: dict[str, float]) -> None:
            nonlocal last_acc
            if state.step % settings.eval_every == 0 and state.step < settings.steps:
                last_acc = await accuracy()
                evals.append((state.step, last_acc))
            if exporter is not None:
                await exporter.step(state.step, {**m, "eval_accuracy": last_acc}, state.version)
            tps = m["generated_tokens"] / max(m["rollout_s"], 1e-9)
            progress.update(bar, advance=1, description=(
                f"step {state.step}  reward {m['reward']:.2f}  acc {last_acc:.1%}  {tps:,.0f} tok/s"))

        health = await client.health()
        state = await grpo_loop(trainer=trainer, runner=runner, sync=sync, prompts=prompts(), steps=settings.steps,
                                state=LoopState(version=health["version"]), on_step=on_step)
    acc_after = await accuracy(samples=settings.final_eval_samples)
    greedy_after = await accuracy(0.0)
    evals.append((state.step, acc_after))
    console.print(f"held-out accuracy after RL:  [bold]{acc_after:.1%}[/bold] at T=1 ({acc_after - acc_before:+.1%}), "
                  f"{greedy_after:.1%} greedy ({greedy_after - greedy_before:+.1%})")
    final = out / "final"
    model.save_pretrained(final)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, final / name)
    write_parquet(all_samples, out / "trajectories.parquet")
    _plot(out / "reward_curve.png", state.history, evals, task)
    metrics = await client.metrics()
    await runner.aclose()
    await client.aclose()
    rollout_s = sum(h["rollout_s"] for h in state.history)
    train_s = sum(h["train_s"] + h["sync_s"] for h in state.history)
    return {
        "accuracy_before": acc_before,  # held-out, policy sampled at T=1 (what GRPO optimises)
        "accuracy_after": acc_after,
        "accuracy_metric": "fraction of held-out answers correct, sampled at T=1 (final_eval_samples per question)",
        "greedy_accuracy_before": greedy_before,
        "greedy_accuracy_after": greedy_after,
        "history": state.history,
        "steps": state.step,
        "final_version": state.version,
        "evals": evals,
        "reward_per_step": [h["reward"] for h in state.history],
        "rollout_seconds": rollout_s,
        "train_seconds": train_s,
        "rollout_fraction": rollout_s / max(rollout_s + train_s, 1e-9),
        "episodes": int(sum(h["episodes"] for h in state.history)),
        "failed_episodes": int(sum(h["failed_episodes"] for h in state.history)),  # training episodes only
        "generated_tokens": int(sum(h["generated_tokens"] for h in state.history)),
        "samples": len(all_samples),
        "gateway_metrics": metrics,
    }


def run_demo(out: Path, *, task: str = "math", seed: int = 0, steps: int | None = None,
             overrides: dict[str, Any] | None = None, metrics_port: int | None = None,
             pushgateway: str | None = None, gateway_metrics_port: int | None = None) -> int:
    from rich.console import Console

    console = Console()
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    settings = DemoSettings.for_task(task)
    if steps is not None:
        settings.steps = steps
    for key, value in (overrides or {}).items():  # for tuning experiments
        setattr(settings, key, value)
    console.rule(f"[bold]rlgate demo[/bold] — task {task!r}, seed {seed}")
    base = ensure_tiny_model(out)
    split = TASKS[task](seed=0)  # the same split for every seed
    tool = None
    if task == "tools":
        from rlgate.demo.calculator_agent import CALCULATOR_TOOL

        tool = dict(CALCULATOR_TOOL)
    warm_dir = out / f"warm-start-{task}-seed{seed}"
    # early stopping looks at items the warm start does not train on (and that are not held out)
    validation = split.train[:settings.validation_items] if settings.warm_start_target is not None else []
    sft_items = split.train[len(validation):]
    ws = warm_start(base, warm_dir, sft_items, task=task, steps=settings.warm_start_steps, seed=seed,
                    lr=settings.warm_start_lr, batch_size=settings.warm_start_batch, tool=tool,
                    target_accuracy=settings.warm_start_target, validation=validation or None,
                    check_every=settings.check_every,
                    log=lambda msg: console.print(f"[dim]{msg}[/dim]"))
    admin_key = secrets.token_urlsafe(32)
    # SIGTERM ends the demo like Ctrl+C does: through the `finally` that stops the gateway
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    proc, url = _start_gateway(warm_dir, admin_key, out / "gateway.log", gateway_metrics_port)
    console.print(f"gateway on {url} (local engine, weights from {warm_dir.name})")
    exporter = None
    if metrics_port is not None or pushgateway:
        from rlgate.train.telemetry import MetricsSettings, StepExporter

        exporter = StepExporter(MetricsSettings(port=metrics_port, pushgateway=pushgateway, job="rlgate-demo"))
        console.print(f"training metrics: {exporter.url or pushgateway}"
                      + (f"; gateway metrics: http://127.0.0.1:{gateway_metrics_port}/metrics"
                         if gateway_metrics_port is not None else ""))
    try:
        result = asyncio.run(_train(url, admin_key, warm_dir, out, task, split, settings, seed, console, exporter))
    finally:
        if exporter is not None:
            exporter.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    wall = time.perf_counter() - t_start
    summary = {"task": task, "seed": seed, "wall_seconds": wall, "warm_start": ws,
               "settings": settings.__dict__, **result}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    console.print(f"wrote {out / 'summary.json'}, {out / 'reward_curve.png'}, {out / 'trajectories.parquet'}, "
                  f"{out / 'final'}  ({wall:.0f} s)")
    return 0
