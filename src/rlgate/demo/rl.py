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
from rlgate.train.checkpoint import TOKENIZER_FILES
from rlgate.train.config import (
    DatasetSource,
    GatewaySettings,
    RolloutSettings,
    TrackingSettings,
    TrainConfig,
)
from rlgate.train.grpo import GRPOConfig, StepResult
from rlgate.train.policy import save_for_serving
from rlgate.train.run import Hooks, TrainRun
from rlgate.trajectory.export import write_jsonl


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


def _start_gateway(model_dir: Path, admin_key: str, log_path: Path, port: int | None = None,
                   metrics_port: int | None = None, device: str | None = None,
                   vllm_url: str | None = None) -> tuple[subprocess.Popen, str]:
    """``rlgate serve`` on 127.0.0.1: the local engine, or (``vllm_url``) in front of that vLLM server."""
    import httpx

    if port:
        from rlgate.train.gateway import check_port_free

        check_port_free(port)
    port = port or _free_port()
    log_file = log_path.open("w")
    extra = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
    extra += ["--device", device] if device and not vllm_url else []
    engine = ["--engine", "vllm", "--backend-url", vllm_url] if vllm_url else ["--engine", "local"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model_dir), *engine,
         "--host", "127.0.0.1", "--port", str(port), "--capacity-mode", "granted", "--log-level", "warning",
         "--model-name", "tiny-policy", "--store", ":memory:", *extra],
        env={**os.environ, "RLGATE_ADMIN_KEY": admin_key},  # not on the command line (ps shows argv)
        stdout=log_file, stderr=subprocess.STDOUT,
        # its own session: a terminal's Ctrl+C (SIGINT to the whole foreground group) reaches the demo only,
        # which stops the gateway itself (stop_gateway, in its `finally`) after the episodes in flight are
        # cancelled; otherwise they fail first, each with a ReadError from a gateway that is already gone
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600  # a loaded machine takes minutes to import torch; an early exit fails at once
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited early; see {log_path}")
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError(f"the gateway did not start; see {log_path}")
    except BaseException:  # Ctrl+C while it starts too: it runs in its own session, so nothing else stops it
        stop_gateway(proc)
        raise


def stop_gateway(proc: subprocess.Popen) -> None:
    """SIGTERM (the gateway drains and flushes), SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def demo_config(task: str, settings: DemoSettings, *, model_dir: Path, out: Path, url: str, admin_key: str,
                seed: int) -> TrainConfig:
    """The demo as a TrainConfig: the tiny warm-started model, the example agents, a remote gateway."""
    agent = "rlgate.demo.agents:CalculatorAgent" if task == "tools" else "rlgate.demo.agents:EitherSDKMathAgent"
    return TrainConfig(
        model=str(model_dir), out_dir=str(out), dataset=DatasetSource(path=str(out / f"{task}-train.jsonl")),
        agent=agent, agent_kwargs={"model": "tiny-policy", "max_tokens": settings.max_tokens},
        steps=settings.steps, seed=seed, checkpoint_every=settings.steps or 1, keep_checkpoints=1, resume=False,
        grpo=GRPOConfig(lr=settings.lr, groups_per_step=settings.groups_per_step,
                        max_staleness=settings.max_staleness, scale_adv_by_std=settings.scale_adv_by_std,
                        micro_batch_size=32, pad_token_id=0, device="cpu"),
        rollout=RolloutSettings(group_size=settings.group_size, concurrency=settings.concurrency, episode_timeout=60,
                                export_style="concat" if task == "tools" else "individual"),
        gateway=GatewaySettings(url=url, admin_key=admin_key, sync_dir=str(out / "sync"), sync_keep=1),
        tracking=TrackingSettings(trajectories=False, plot=False),
    )


class DemoHooks(Hooks):
    """What the demo adds to a plain run: accuracy before / after (T=1 and greedy), held-out
    accuracy every ``eval_every`` steps, a progress bar, the trained samples, the outputs."""

    def __init__(self, task: str, heldout: list[dict[str, Any]], settings: DemoSettings, console: Any,
                 model_dir: Path, exporter: Any = None) -> None:
        self.task, self.heldout, self.settings, self.console, self.model_dir = task, heldout, settings, console, model_dir
        self.exporter = exporter  # train/telemetry.py StepExporter (--metrics-port / --pushgateway), or None
        self.samples: list[Any] = []
        self.evals: list[tuple[int, float]] = []
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.progress: Any = None
        self.bar: Any = None
        self.last_acc = 0.0
        self.model_label = "tiny model"  # the plot's title

    async def accuracy(self, run: TrainRun, temperature: float = 1.0, samples: int | None = None) -> float:
        """Fraction of held-out questions answered right by the policy (mean over samples)."""
        n = (samples or self.settings.eval_samples) if temperature > 0 else 1
        res = await run.evaluate(self.heldout, samples_per_item=n, temperature=temperature, record=False)
        return res.reward_mean_failed_as_zero

    async def on_start(self, run: TrainRun) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        t0 = time.perf_counter()
        self.before = {"t1": await self.accuracy(run, samples=self.settings.final_eval_samples),
                       "greedy": await self.accuracy(run, 0.0)}
        self.last_acc = self.before["t1"]
        self.evals.append((0, self.before["t1"]))
        self.console.print(
            f"held-out accuracy before RL: [bold]{self.before['t1']:.1%}[/bold] at the training temperature "
            f"(T=1), {self.before['greedy']:.1%} greedy ({len(self.heldout)} questions, "
            f"{time.perf_counter() - t0:.1f} s)")
        columns = [TextColumn("[bold]GRPO[/bold]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TextColumn("{task.description}"), TimeElapsedColumn()]
        self.progress = Progress(*columns, console=self.console, transient=False)
        self.progress.start()
        self.bar = self.progress.add_task("starting", total=self.settings.steps)

    async def on_step(self, run: TrainRun, result: StepResult) -> None:
        self.samples += result.samples
        step = run.state.step
        if step % self.settings.eval_every == 0 and step < self.settings.steps:
            self.last_acc = await self.accuracy(run)
            self.evals.append((step, self.last_acc))
        m = result.metrics
        if self.exporter is not None:
            await self.exporter.step(step, {**m, "eval_accuracy": self.last_acc}, run.state.version)
        tps = m.get("tokens_per_s", 0.0)
        self.progress.update(self.bar, advance=1, description=(
            f"step {step}  reward {m['reward']:.2f}  acc {self.last_acc:.1%}  {tps:,.0f} tok/s"))

    async def on_end(self, run: TrainRun) -> None:
        from rlgate.train.plot import plot_reward_curve
        from rlgate.trajectory.export import write_parquet

        self.progress.stop()
        self.after = {"t1": await self.accuracy(run, samples=self.settings.final_eval_samples),
                      "greedy": await self.accuracy(run, 0.0)}
        self.evals.append((run.state.step, self.after["t1"]))
        d_t1 = self.after["t1"] - self.before["t1"]
        d_greedy = self.after["greedy"] - self.before["greedy"]
        self.console.print(f"held-out accuracy after RL:  [bold]{self.after['t1']:.1%}[/bold] at T=1 ({d_t1:+.1%}), "
                           f"{self.after['greedy']:.1%} greedy ({d_greedy:+.1%})")
        final = run.out / "final"
        save_for_serving(run.trainer.model, final)  # LoRA: the merged weights, a model any engine serves
        for name in TOKENIZER_FILES:
            if (self.model_dir / name).is_file():
                shutil.copy(self.model_dir / name, final / name)
        write_parquet(self.samples, run.out / "trajectories.parquet")
        plot_reward_curve(run.out / "reward_curve.png", run.state.history, self.evals,
                          title=f"rlgate demo — task '{self.task}', {self.model_label} on CPU",
                          eval_label="held-out accuracy (T=1)", unit_range=True)


async def _train(url: str, admin_key: str, model_dir: Path, out: Path, task: str, split: Any,
                 settings: DemoSettings, seed: int, console: Any, exporter: Any = None) -> dict[str, Any]:
    from rlgate.client import GatewayClient
    from rlgate.train.run import run_training

    write_jsonl(split.train, out / f"{task}-train.jsonl")
    cfg = demo_config(task, settings, model_dir=model_dir, out=out, url=url, admin_key=admin_key, seed=seed)
    hooks = DemoHooks(task, split.heldout[: settings.eval_items], settings, console, model_dir, exporter)
    result = await run_training(cfg, hooks, stdout=False)
    history = _read_history(out)
    async with GatewayClient(url, admin_key) as client:
        metrics = await client.metrics()
    rollout_s = sum(h["rollout_s"] for h in history)
    train_s = sum(h["train_s"] + h["sync_s"] for h in history)
    return {
        "accuracy_before": hooks.before["t1"],  # held-out, policy sampled at T=1 (what GRPO optimises)
        "accuracy_after": hooks.after["t1"],
        "accuracy_metric": "fraction of held-out answers correct, sampled at T=1 (final_eval_samples per question)",
        "greedy_accuracy_before": hooks.before["greedy"],
        "greedy_accuracy_after": hooks.after["greedy"],
        "history": history,
        "steps": result["steps"],
        "final_version": result["version"],
        "evals": hooks.evals,
        "reward_per_step": [h["reward"] for h in history],
        "rollout_seconds": rollout_s,
        "train_seconds": train_s,
        "rollout_fraction": rollout_s / max(rollout_s + train_s, 1e-9),
        "episodes": int(sum(h["episodes"] for h in history)),
        "failed_episodes": int(sum(h["failed_episodes"] for h in history)),  # training episodes only
        "generated_tokens": int(sum(h["generated_tokens"] for h in history)),
        "samples": len(hooks.samples),
        "gateway_metrics": metrics,
    }


def _read_history(out: Path) -> list[dict[str, float]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_demo(out: Path, *, task: str = "math", seed: int = 0, steps: int | None = None,
             overrides: dict[str, Any] | None = None, port: int | None = None, metrics_port: int | None = None,
             pushgateway: str | None = None, gateway_metrics_port: int | None = None) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)  # no hard wrap at 80 columns when the output is not a terminal
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
    proc, url = _start_gateway(warm_dir, admin_key, out / "gateway.log", port, gateway_metrics_port)
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
        stop_gateway(proc)
    wall = time.perf_counter() - t_start
    summary = {"task": task, "seed": seed, "wall_seconds": wall, "warm_start": ws,
               "settings": settings.__dict__, **result}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    console.print(f"wrote {out / 'summary.json'}, {out / 'reward_curve.png'}, {out / 'trajectories.parquet'}, "
                  f"{out / 'final'}  ({wall:.0f} s)")
    return 0
