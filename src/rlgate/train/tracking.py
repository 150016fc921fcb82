"""Where a run's per-step metrics go: stdout, metrics.jsonl, TensorBoard, W&B, MLflow.

* **stdout** — one line per step: time, step/total, reward, loss, KL, tokens/s, failed
  episodes, step time and ETA.
* **metrics.jsonl** — every metric of every step (always on; appended on resume).
* **TensorBoard** (default on) — event files in ``out_dir/tensorboard``, written with
  ``tensorboardX``: a small, maintained writer that needs neither TensorFlow nor the
  ``tensorboard`` package (``torch.utils.tensorboard`` imports ``tensorboard``: ~50 MB
  with grpcio and its data server, measured in docs/architecture.md); view with
  ``tensorboard --logdir out_dir/tensorboard``.
* **W&B** / **MLflow** when asked for (``tracking.wandb`` / ``tracking.mlflow``) and
  installed; asking for one that is not installed is a config error before the run starts.

Prometheus metrics of the gateway and the trainer are issue 17's (``metrics/``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any, Protocol

from rlgate.train.config import ConfigError, TrainConfig


class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


ENTROPY_COLLAPSE = 0.05  # nats per generated token: below it the policy samples almost one reply per prompt


def _signal(metrics: dict[str, float]) -> str:
    """``signal 3/4 ent 1.23 cut 5 ``: groups whose rewards varied (the others teach nothing), the policy's
    mean token entropy and the played episodes with a reply cut by max_tokens; empty for metrics without them."""
    out = ""
    if "groups" in metrics:
        groups = int(metrics["groups"])
        out += f"signal {groups - int(metrics.get('zero_variance_groups', 0))}/{groups} "
        if metrics.get("resampled_groups"):
            out += f"(+{int(metrics['resampled_groups'])} resampled) "
    if "entropy" in metrics:
        out += f"ent {metrics['entropy']:.2f} "
    if metrics.get("truncated_episodes"):
        out += f"cut {int(metrics['truncated_episodes'])} "  # episodes with a reply cut by max_tokens
    return out


def _alarms(metrics: dict[str, float]) -> str:
    """What makes a step teach nothing, said on its line: no group with reward variance (no update),
    or a collapsed policy (entropy below ENTROPY_COLLAPSE)."""
    out = []
    if metrics.get("updates", 1.0) == 0:
        out.append("NO SIGNAL: every group's rewards were equal, no update (grpo.dynamic_sampling resamples such "
                   "groups)")
    if "entropy" in metrics and metrics["entropy"] < ENTROPY_COLLAPSE:
        out.append(f"ENTROPY COLLAPSE: {metrics['entropy']:.3f} nats < {ENTROPY_COLLAPSE} (lower grpo.lr, add "
                   "grpo.kl_coef)")
    return "".join(f"  [{a}]" for a in out)


class StdoutTracker:
    """``2026-12-03 10:11:12 step 12/200 reward 0.512 signal 3/4 ent 1.23 loss 0.0123 approx_kl -3.1e-05 tok/s 1234
    failed 0 3.2s eta 10m02s`` (+ the step's alarms: no signal, entropy collapse). The KL shown is named by its
    metric: ``kl_ref`` (the k3 estimate of KL to the reference, never negative) when ``kl_coef > 0``, else
    ``approx_kl`` (the k1 estimate of KL between the policy before and after the update: the mean of
    ``logp_prox - logp``, which can be negative; a bare "kl -3e-05" read as a bug)."""

    def __init__(self, total_steps: int, print_fn: Any = print, *, kl_ref: bool = False) -> None:
        self.total = total_steps
        self.print = print_fn
        self.kl_name = "kl_ref" if kl_ref else "approx_kl"
        self._durations: list[float] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if "step_s" not in metrics:  # an evaluation
            shown = " ".join(f"{k.removeprefix('eval/')} {v:.4g}" for k, v in metrics.items())
            self.print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} eval at step {step}: {shown}", flush=True)
            return
        self._durations.append(metrics["step_s"])
        recent = self._durations[-10:]
        eta = (self.total - step) * sum(recent) / len(recent)
        tps = metrics.get("tokens_per_s", 0.0)
        speed = format(tps, ",.0f" if tps >= 10 else ".2f")
        self.print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} step {step}/{self.total} reward {metrics['reward']:.3f} "
            f"{_signal(metrics)}loss {metrics['loss']:.4f} {self.kl_name} {metrics.get(self.kl_name, 0.0):.2e} "
            f"tok/s {speed} "
            f"failed {int(metrics.get('failed_episodes', 0))} {metrics['step_s']:.1f}s eta {_fmt_duration(eta)}"
            f"{_alarms(metrics)}", flush=True)

    def close(self) -> None:
        pass


class JsonlTracker:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("a", encoding="utf-8")

    def drop_from(self, step: int) -> None:
        """Remove the lines of ``step`` and later (a resumed run redoing them); appends go on at the end."""
        self.file.flush()
        keep = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) < step]
        self.path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": float(step), **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


SAMPLES_PER_STEP = 4
MAX_TEXT = 400  # characters of a completion shown


def samples_table(samples: list[Any], n: int = SAMPLES_PER_STEP) -> list[dict[str, Any]]:
    """A few of a step's samples for the trackers: the best and the worst of the first groups."""
    groups: dict[str, list[Any]] = {}
    for s in samples:
        groups.setdefault(str(s.group_id), []).append(s)
    picked: list[Any] = []
    for members in groups.values():
        ranked = sorted(members, key=lambda s: s.reward if s.reward is not None else -math.inf, reverse=True)
        picked += ranked[:1] + ranked[-1:] if len(ranked) > 1 else ranked
        if len(picked) >= n:
            break
    return [{"group": str(s.group_id), "episode": s.episode, "reward": s.reward, "tokens": s.generated_tokens,
             "completion": s.output_text or json.dumps((s.output_message or {}).get("tool_calls"))[:MAX_TEXT]}
            for s in picked[:n]]


def _markdown(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        text = str(v)[:MAX_TEXT].replace("|", "\\|").replace("\n", " ⏎ ")
        return text

    head = "| group | episode | reward | tokens | completion |\n|---|---|---|---|---|\n"
    return head + "".join(f"| {cell(r['group'])} | {r['episode']} | {r['reward']} | {r['tokens']} | "
                          f"{cell(r['completion'])} |\n" for r in rows)


class TensorBoardTracker:
    def __init__(self, logdir: Path, purge_step: int | None = None) -> None:
        """``purge_step``: on resume, events from this step on (written after the checkpoint) are dropped."""
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(logdir), flush_secs=10, purge_step=purge_step)

    def log_config(self, text: str, step: int) -> None:
        self.writer.add_text("config", "```yaml\n" + text + "\n```", global_step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", _markdown(rows), global_step=step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.writer.add_scalar(k if "/" in k else f"train/{k}", v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, cfg: TrainConfig, name: str) -> None:
        import wandb

        self.run = wandb.init(project=cfg.tracking.wandb_project, name=name, dir=cfg.out_dir,
                              config=cfg.model_dump(mode="json", exclude={"gateway": {"admin_key"}}),
                              resume="allow", id=_stable_id(cfg))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k if "/" in k else f"train/{k}": v for k, v in metrics.items()}, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        columns = ["group", "episode", "reward", "tokens", "completion"]
        self.run.log({"samples": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])},
                     step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, cfg: TrainConfig, name: str) -> None:
        import mlflow

        self.mlflow = mlflow
        if cfg.tracking.mlflow_tracking_uri:
            mlflow.set_tracking_uri(cfg.tracking.mlflow_tracking_uri)
        mlflow.set_experiment(cfg.tracking.mlflow_experiment)
        self.run = mlflow.start_run(run_name=name)
        flat = _flatten(cfg.model_dump(mode="json", exclude={"gateway": {"admin_key"}}))
        mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k.replace("/", "_"): float(v) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and math.isfinite(v)}
        self.mlflow.log_metrics(clean, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.mlflow.log_text(_markdown(rows), f"samples/step-{step:06d}.md")

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _stable_id(cfg: TrainConfig) -> str:
    import hashlib

    return hashlib.sha256(str(Path(cfg.out_dir).resolve()).encode()).hexdigest()[:16]


def check_tracking(cfg: TrainConfig) -> None:
    """ConfigError if a tracker that was asked for is not installed."""
    wanted = [("tensorboard", cfg.tracking.tensorboard, "tensorboardX", "pip install tensorboardX (rlgate[train])"),
              ("wandb", cfg.tracking.wandb, "wandb", "pip install wandb"),
              ("mlflow", cfg.tracking.mlflow, "mlflow", "pip install mlflow-skinny")]
    for key, on, module, how in wanted:
        if on and importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracking.{key} is on but the {module} package is not installed ({how}, "
                              f"or set tracking.{key}: false)")


class Trackers:
    """All trackers of a run, fanned out."""

    def __init__(self, cfg: TrainConfig, out: Path, total_steps: int, *, stdout: bool | None = None,
                 start_step: int = 0) -> None:
        name = cfg.tracking.run_name or out.resolve().name
        self.evals = JsonlTracker(out / "evals.jsonl")
        # a resumed run evaluates its starting checkpoint again: that evaluation replaces the old line
        # (when it is logged, so that a resume failing before it loses nothing)
        self._replace_eval_at: int | None = start_step or None
        self.items: list[Tracker] = [JsonlTracker(out / "metrics.jsonl")]
        if cfg.tracking.stdout if stdout is None else stdout:
            self.items.append(StdoutTracker(total_steps, kl_ref=cfg.grpo.kl_coef > 0))
        if cfg.tracking.tensorboard:
            tb = TensorBoardTracker(out / "tensorboard", purge_step=start_step + 1 if start_step else None)
            tb.log_config(cfg.to_yaml(), start_step)  # W&B and MLflow get it as the run's config / params
            self.items.append(tb)
        if cfg.tracking.wandb:
            self.items.append(WandbTracker(cfg, name))
        if cfg.tracking.mlflow:
            self.items.append(MlflowTracker(cfg, name))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for t in self.items:
            t.log(step, metrics)

    def log_samples(self, step: int, samples: list[Any]) -> None:
        """A few of the step's samples with their rewards: TensorBoard text, a W&B table, an MLflow artifact."""
        rows = samples_table(samples)
        for t in self.items:
            log = getattr(t, "log_samples", None)
            if log is not None and rows:
                log(step, rows)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        """Evaluation results: to evals.jsonl, and as ``eval/<name>`` to the other trackers."""
        if self._replace_eval_at is not None and step >= self._replace_eval_at:
            self.evals.drop_from(step)
            self._replace_eval_at = None
        self.evals.log(step, metrics)
        tagged = {f"eval/{k}": v for k, v in metrics.items()}
        for t in self.items:
            if not isinstance(t, JsonlTracker):
                t.log(step, tagged)

    def close(self) -> None:
        for t in [self.evals, *self.items]:
            t.close()
