"""``rlgate train --config FILE.yaml``: GRPO on any Hugging Face checkpoint — the one loop wiring.

``rlgate train`` and ``rlgate demo`` both run :func:`run_training`: a :class:`TrainConfig`
plus optional :class:`Hooks`. Top to bottom:

1. **prepare** — everything that can be wrong is checked before any model is loaded:
   the config (strict, train/config.py), the model path, the datasets, the agent (its
   import and contract), the reward function, the trackers that were asked for;
2. **gateway** — start one in this process, check the remote one, or start ``ray.replicas``
   replicas on Ray behind a router (train/gateway.py);
3. **trainer** — the model (from the latest checkpoint when resuming), the optimiser
   state, the KL reference;
4. **loop** — :func:`~rlgate.train.grpo.grpo_loop`; after each step: trackers (stdout,
   metrics.jsonl, TensorBoard, W&B, MLflow; Prometheus with ``metrics:``), optional trajectory dump, evaluation every
   ``eval_every`` steps, checkpoint every ``checkpoint_every`` (keeping the last
   ``keep_checkpoints``), the hooks;
5. **end** — final checkpoint, evaluation, reward curve. Ctrl-C (SIGINT) stops the loop,
   saves a checkpoint of the last completed step and prints where; a second Ctrl-C
   exits at once. An :class:`Interrupt` does the same from another thread (the trainer
   actor of ``ray.trainer``, train/remote.py, which runs all of this on the cluster).

Run directory ``out_dir``: ``config.yaml`` (the full resolved config), ``metrics.jsonl``,
``evals.jsonl``, ``tensorboard/``, ``checkpoints/step-NNNNNN/`` + ``latest``,
``reward_curve.png``, ``trajectories/step-NNNNNN.parquet`` (``tracking.trajectories``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from rlgate.client import GatewayClientError
from rlgate.rollout.errors import RunError
from rlgate.train.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from rlgate.train.config import ConfigError, TrainConfig
from rlgate.train.loading import load_agent, load_dataset, load_reward_fn, resolve_model
from rlgate.train.tracking import Trackers, check_tracking

if TYPE_CHECKING:  # torch is imported only once a run starts (config errors come first, and fast)
    from rlgate.train.grpo import LoopState, StepResult


class Hooks:
    """Override any of these to add to a run (the demo does); each may be sync or async."""

    def on_start(self, run: TrainRun) -> Any:
        """After the gateway, trainer and runner are up, before the first evaluation."""

    def on_step(self, run: TrainRun, result: StepResult) -> Any:
        """After each step's trackers, evaluation and checkpoint."""

    def on_end(self, run: TrainRun) -> Any:
        """After the last step's checkpoint and evaluation (not after an error or Ctrl-C)."""


async def _call(out: Any) -> None:
    if asyncio.iscoroutine(out):
        await out


@dataclass
class Prepared:
    """What a config names, loaded and checked (no model loaded yet)."""

    model: Path
    data: list[dict[str, Any]]
    eval_data: list[dict[str, Any]]
    agent: Any
    reward_fn: Any


def prepare(cfg: TrainConfig, *, need_data: bool = True) -> Prepared:
    """Check and load everything the config names; :class:`ConfigError` names the first culprit."""
    model = resolve_model(cfg.model)
    data = load_dataset(cfg.dataset) if need_data else []
    eval_data = load_dataset(cfg.eval_dataset, "eval_dataset") if cfg.eval_dataset else []
    agent = load_agent(cfg.agent, cfg.agent_kwargs)
    reward_fn = load_reward_fn(cfg.reward, cfg.reward_kwargs) if cfg.reward else None
    check_tracking(cfg)
    from rlgate.train.policy import check_lora

    check_lora(cfg.train)
    if cfg.ray is not None:
        from rlgate.train.gateway import check_ray

        check_ray()
    return Prepared(model, data, eval_data, agent, reward_fn)


async def prepare_start(cfg: TrainConfig, *, need_data: bool = True, log: Any = print) -> Prepared:
    """:func:`prepare`, with ``model`` the checkpoint the run starts from: the configured one, or its warm
    start (``warm_start:``, train/warm_start.py: made now or reused)."""
    return await warm(cfg, prepare(cfg, need_data=need_data), log=log)


async def warm(cfg: TrainConfig, prep: Prepared, *, log: Any = print) -> Prepared:
    """``prep`` starting from the config's warm start, if it has one (made now, or reused)."""
    if cfg.warm_start is not None:
        from rlgate.train.warm_start import starting_model

        prep.model = await asyncio.to_thread(starting_model, cfg, prep.model, log=log)
    return prep


def make_runner(cfg: TrainConfig, client: Any, agent: Any, reward_fn: Any) -> Any:
    from rlgate.train.rollout import rollout_runner

    return rollout_runner(cfg.rollout, client, agent, reward_fn=reward_fn,
                          ray_options=cfg.ray.episode if cfg.ray is not None else None)


# --------------------------------------------------------------------------- evaluation


@dataclass
class EvalResult:
    reward_mean: float  # over completed episodes
    reward_std: float
    reward_mean_failed_as_zero: float  # failed episodes counted as reward 0
    episodes: int
    failed: int
    items: int
    samples_per_item: int
    temperature: float
    per_item: list[dict[str, Any]] = field(default_factory=list)  # {"index", "rewards": [float | None]}

    def metrics(self) -> dict[str, float]:
        return {"reward_mean": self.reward_mean, "reward_std": self.reward_std, "failed": float(self.failed),
                "episodes": float(self.episodes)}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def evaluate(runner: Any, items: list[dict[str, Any]], *, samples_per_item: int = 1,
                   temperature: float = 0.0, group_id: str = "eval") -> EvalResult:
    """Each item played ``samples_per_item`` times with ``data["temperature"] = temperature``."""
    played = [{**d, "temperature": temperature} for d in items for _ in range(samples_per_item)]
    episodes = await runner.evaluate(played, group_id=group_id)
    done = [e.reward for e in episodes if e.ok and e.reward is not None]
    per_item = [{"index": i, "rewards": [e.reward if e.ok else None
                                         for e in episodes[i * samples_per_item:(i + 1) * samples_per_item]]}
                for i in range(len(items))]
    return EvalResult(
        reward_mean=statistics.fmean(done), reward_std=statistics.pstdev(done) if len(done) > 1 else 0.0,
        reward_mean_failed_as_zero=sum(done) / len(episodes), episodes=len(episodes),
        failed=len(episodes) - len(done), items=len(items), samples_per_item=samples_per_item,
        temperature=temperature, per_item=per_item)


# --------------------------------------------------------------------------- the run


@dataclass
class TrainRun:
    """A run in progress: what hooks see."""

    cfg: TrainConfig
    out: Path
    trainer: Any
    runner: Any
    client: Any
    sync: Any
    state: LoopState
    trackers: Trackers
    eval_data: list[dict[str, Any]]
    tokenizer_dir: Path
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, eval reward_mean)
    last_checkpoint: Path | None = None

    async def evaluate(self, items: list[dict[str, Any]] | None = None, *, samples_per_item: int | None = None,
                       temperature: float | None = None, record: bool = True) -> EvalResult:
        """Evaluate now (default: the config's eval dataset and settings); ``record`` logs it and
        adds it to the curve."""
        res = await evaluate(self.runner, self.eval_data if items is None else items,
                             samples_per_item=samples_per_item or self.cfg.eval_samples_per_item,
                             temperature=self.cfg.eval_temperature if temperature is None else temperature,
                             group_id=f"eval-s{self.state.step}")
        if record:
            self.evals.append((self.state.step, res.reward_mean))
            self.trackers.log_eval(self.state.step, res.metrics())
        return res

    def checkpoint(self) -> Path:
        self.last_checkpoint = save_checkpoint(self.out, self.trainer, self.state, self.tokenizer_dir,
                                               keep=self.cfg.keep_checkpoints)
        return self.last_checkpoint

    def plot(self) -> None:
        if self.cfg.tracking.plot and self.state.history:
            from rlgate.train.plot import plot_reward_curve

            plot_reward_curve(self.out / "reward_curve.png", self.state.history, self.evals,
                              title=f"rlgate train — {self.out.name}",
                              eval_label=f"eval reward (T={self.cfg.eval_temperature:g})")


def _prompts(data: list[dict[str, Any]], seed: int, state: LoopState) -> Iterator[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed + state.step)  # a resumed run does not replay the same order
    i = 0
    while True:
        order = list(range(len(data)))
        rng.shuffle(order)
        for j in order:
            yield f"s{state.step}-g{i}", data[j]
            i += 1


def _trim_jsonl(path: Path, upto: int | None) -> None:
    """Keep the lines of steps up to ``upto`` (later ones are redone after a resume); None: a fresh
    run, the file starts empty."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and upto is not None and json.loads(line).get("step", 0) <= upto]
    path.write_text("".join(line + "\n" for line in keep))


def _recorded_evals(path: Path) -> list[tuple[int, float]]:
    """(step, reward_mean) of each evaluation ``evals.jsonl`` holds."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(int(r["step"]), float(r["reward_mean"])) for r in rows if "step" in r and "reward_mean" in r]


class Terminated(Exception):  # noqa: N818 - what happened, as KeyboardInterrupt
    """The run was stopped by SIGTERM (a scheduler preempting it): the last completed step is saved,
    the message printed; ``rlgate train`` exits 143 (128 + SIGTERM)."""


async def run_training(cfg: TrainConfig, hooks: Hooks | None = None, *, stdout: bool | None = None,
                       interrupt: Interrupt | None = None) -> dict[str, Any]:
    """Run ``cfg``; returns a summary. ``stdout=False`` silences the per-step lines (the demo draws a bar);
    ``interrupt`` lets another thread stop the run as Ctrl-C does. SIGTERM (in the main thread) stops
    it as Ctrl-C does too, then raises :class:`Terminated`."""
    ctrl_c = _CtrlC()
    ctrl_c.install()
    try:
        return await _run_training(cfg, hooks, stdout=stdout, interrupt=interrupt, ctrl_c=ctrl_c)
    except asyncio.CancelledError:
        if not ctrl_c.terminated:
            raise
        if not ctrl_c.reported:
            print("\nterminated (SIGTERM) before the first step of this run: nothing new to save", flush=True)
        raise Terminated from None
    finally:
        ctrl_c.restore()


async def _run_training(cfg: TrainConfig, hooks: Hooks | None, *, stdout: bool | None,
                        interrupt: Interrupt | None, ctrl_c: _CtrlC) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.train.gateway import GatewayPlan, open_gateway
    from rlgate.train.grpo import GRPOTrainer, LoopState, grpo_loop
    from rlgate.train.policy import load_policy
    from rlgate.train.telemetry import StepExporter

    hooks = hooks or Hooks()
    if interrupt is not None:
        interrupt.bind()
    # ------------------------------------------------------------------ 1. prepare
    prep = prepare(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prep = await warm(cfg, prep, log=(lambda _: None) if stdout is False else print)
    (out / "config.yaml").write_text(cfg.to_yaml())
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ckpt = latest_checkpoint(out) if cfg.resume else None
    state = LoopState()
    saved = load_trainer_state(ckpt) if ckpt is not None else None
    if saved is not None:
        state.step, state.history = saved["step"], saved["history"]
    resumed = state.step > 0
    _trim_jsonl(out / "metrics.jsonl", state.step if resumed else None)
    # a resumed run evaluates its starting checkpoint again (at state.step): that line is its own
    # (replaced when that evaluation is logged, not now: a resume that fails before it keeps the line)
    _trim_jsonl(out / "evals.jsonl", state.step if resumed else None)
    if state.step == 0:
        shutil.rmtree(out / "tensorboard", ignore_errors=True)
        shutil.rmtree(out / "trajectories", ignore_errors=True)
    # ------------------------------------------------------------------ 2. gateway
    weights = ckpt or prep.model
    version = int(saved.get("version") or 0) if saved else 0
    lora_resume = ckpt is not None and cfg.train.lora is not None
    if lora_resume:  # a checkpoint holds the adapter: serve the base, then push the merged weights (-> version)
        weights, version = prep.model, max(version - 1, 0)
    gw = await open_gateway(GatewayPlan.of(cfg), weights, prep.model, version=version)
    trackers = None
    exporter = None
    runner = None
    try:
        # -------------------------------------------------------------- 3. trainer
        try:
            model = load_policy(cfg, prep.model, ckpt)
            # the KL reference is the starting model, also when resuming from a checkpoint (or training LoRA)
            ref = (AutoModelForCausalLM.from_pretrained(prep.model, dtype=model.dtype)
                   if (ckpt is not None or cfg.train.lora is not None) and cfg.grpo.kl_coef > 0 else None)
        except RunError:
            raise
        except Exception as exc:  # noqa: BLE001 - name the checkpoint, not transformers' internals
            raise RunError(f"model: cannot load {ckpt or prep.model}: {type(exc).__name__}: {exc}") from None
        trainer = GRPOTrainer(model, cfg.grpo, ref_model=ref, total_steps=cfg.steps, steps_done=state.step,
                              autocast="bfloat16" if cfg.train.dtype == "mixed" else None)
        await gw.start_policy(trainer.model, int(saved.get("version") or 0) if saved else None)  # gateway.policy
        if saved is not None:
            trainer.optimizer.load_state_dict(saved["optimizer"])
            print(f"resuming from {ckpt} (step {state.step})", flush=True)
            if (gw.remote or lora_resume) and gw.policy is None:
                await gw.sync.push(trainer.model)  # the gateway must serve the resumed weights
        runner = make_runner(cfg, gw.client, prep.agent, prep.reward_fn)
        trackers = Trackers(cfg, out, cfg.steps, stdout=stdout, start_step=state.step)
        exporter = StepExporter(cfg.metrics, extra_registries=gw.registries)
        if exporter.url and stdout is not False:
            print(f"metrics: {exporter.url}", flush=True)
        run = TrainRun(cfg, out, trainer, runner, gw.client, gw.sync, state, trackers, prep.eval_data, prep.model)
        run.last_checkpoint = ckpt
        state.version = await gw.client.version()  # the default policy's, or gateway.policy's
        await _call(hooks.on_start(run))
        # -------------------------------------------------------------- 4. loop
        # a resumed run whose starting weights were evaluated already (the last run's final evaluation, in
        # evals.jsonl) does not evaluate them again: the curve goes on from there (issue 40)
        recorded = _recorded_evals(out / "evals.jsonl") if resumed else []
        run.evals += recorded
        first_eval = next((r for s, r in recorded if s == state.step), None)
        if first_eval is None and run.eval_data:
            first_eval = (await run.evaluate()).reward_mean

        def record(step: int, result: StepResult) -> None:  # metrics.jsonl, trackers, trajectories
            trackers.log(step, result.metrics)
            trackers.log_samples(step, result.samples)
            if cfg.tracking.trajectories:
                from rlgate.trajectory.export import write_parquet

                (out / "trajectories").mkdir(exist_ok=True)
                write_parquet(result.samples, out / "trajectories" / f"step-{step:06d}.parquet")

        async def on_step(st: LoopState, result: StepResult) -> None:
            # a Ctrl-C (or Interrupt) whose cancellation something swallowed: stop here all the same
            if ctrl_c.seen or (interrupt is not None and interrupt.seen):
                raise asyncio.CancelledError
            record(st.step, result)
            if cfg.eval_every and st.step % cfg.eval_every == 0 and st.step < cfg.steps and run.eval_data:
                await run.evaluate()
            if st.step % cfg.checkpoint_every == 0:
                run.checkpoint()
                run.plot()
            await _call(hooks.on_step(run, result))
            last_eval = {"eval_reward": run.evals[-1][1]} if run.evals else {}
            await exporter.step(st.step, {**result.metrics, **last_eval}, st.version)  # Prometheus (`metrics:`)

        remaining = max(0, cfg.steps - state.step)
        try:
            await grpo_loop(trainer=trainer, runner=runner, sync=gw.sync,
                            prompts=_prompts(prep.data, cfg.seed, state), steps=remaining, state=state,
                            on_step=on_step)
        except asyncio.CancelledError:  # Ctrl-C or SIGTERM: keep what was learned
            if state.unreported is not None:  # a step that finished as the stop came: logged like the others
                record(state.step, state.unreported)
                state.unreported = None
            message = _save_on_interrupt(run, "terminated (SIGTERM)" if ctrl_c.terminated else "interrupted")
            ctrl_c.reported = True
            if interrupt is not None:
                interrupt.message = message  # the driver prints it (train/remote.py)
            else:
                print(message, flush=True)
            raise
        # -------------------------------------------------------------- 5. end
        if run.last_checkpoint is None or run.last_checkpoint.name != f"step-{state.step:06d}":
            run.checkpoint()
        final_eval = (await run.evaluate()).reward_mean if run.eval_data and remaining else first_eval
        run.plot()
        await _call(hooks.on_end(run))
        return {"steps": state.step, "version": state.version, "eval_start": first_eval, "eval_end": final_eval,
                "checkpoint": str(run.last_checkpoint), "out_dir": str(out)}
    finally:
        if trackers is not None:
            trackers.close()
        if exporter is not None:
            exporter.close()
        if runner is not None:
            await runner.aclose()
        await gw.close()


class _CtrlC:
    """Notes a Ctrl-C (SIGINT) before handing it to the handler in place (asyncio.run's, which
    cancels the main task). A cancellation can be lost if it lands while a library swallows it
    (seen once under heavy load); the note makes the loop stop at the next step all the same.

    SIGTERM (what a scheduler sends before killing a job) is handled the same way: the run's task
    is cancelled, the last completed step saved, and ``terminated`` set; a second SIGTERM kills
    the process at once (the default action)."""

    def __init__(self) -> None:
        self.seen = False
        self.terminated = False  # the stop came from SIGTERM
        self.reported = False  # the message saying what was saved has been printed
        self._previous: Any = None
        self._previous_term: Any = None
        self._task: asyncio.Task[Any] | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only
        self._task = asyncio.current_task()
        previous_term = signal.getsignal(signal.SIGTERM)
        if previous_term in (signal.SIG_DFL, None):  # nobody else asked for it (never override a host's)
            self._previous_term = previous_term
            signal.signal(signal.SIGTERM, self._handle_term)
        previous = signal.getsignal(signal.SIGINT)
        if previous == signal.SIG_IGN:
            return  # started with SIGINT ignored (a background job): keep it so
        self._previous = previous
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen = True
        if callable(self._previous):
            self._previous(signum, frame)
        else:
            raise KeyboardInterrupt

    def _handle_term(self, signum: int, frame: Any) -> None:
        if self.terminated or self._task is None or self._task.done():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the second one: exit now
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.seen = self.terminated = True
        self._task.cancel()  # as asyncio.run's SIGINT handler does
        self._task.get_loop().call_soon_threadsafe(lambda: None)  # wake the loop

    def restore(self) -> None:
        if self._previous is not None and signal.getsignal(signal.SIGINT) == self._handle:
            signal.signal(signal.SIGINT, self._previous)
        if signal.getsignal(signal.SIGTERM) == self._handle_term:
            signal.signal(signal.SIGTERM, self._previous_term or signal.SIG_DFL)
        self._previous = self._previous_term = self._task = None


class Interrupt:
    """A stop request from another thread, handled as Ctrl-C is: the loop stops, the last completed
    step is saved, and the run ends with :class:`asyncio.CancelledError` (its message, saying where
    the checkpoint is, in ``message``)."""

    def __init__(self) -> None:
        self.seen = False
        self.message: str | None = None
        self._target: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
        self._lock = threading.Lock()

    def bind(self) -> None:
        """Called by :func:`run_training` in its task: the task a request cancels."""
        task = asyncio.current_task()
        assert task is not None
        with self._lock:
            self._target = (asyncio.get_running_loop(), task)
            if self.seen:  # asked before the run started
                task.cancel()

    def request(self) -> None:
        """Thread-safe; a request after the run ended does nothing."""
        with self._lock:
            self.seen = True
            if self._target is not None:
                loop, task = self._target
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop has closed: the run is over
                    pass


def _save_on_interrupt(run: TrainRun, what: str = "interrupted") -> str:
    """Saves the last completed step (unless its checkpoint exists); the message saying where."""
    if run.state.step and (run.last_checkpoint is None or run.last_checkpoint.name != f"step-{run.state.step:06d}"):
        run.checkpoint()
    if run.last_checkpoint is not None:
        step = int(run.last_checkpoint.name.removeprefix("step-"))
        return f"\n{what}: step {step} saved to {run.last_checkpoint}; run the same command again to resume"
    return f"\n{what} before the first step: nothing to save"


def report_error(exc: BaseException, command: str = "train") -> int:
    """Print one clear message for a run that cannot go on; the exit code."""
    print(f"rlgate {command}: error: {exc}", file=sys.stderr, flush=True)
    return 2 if isinstance(exc, ConfigError) else 1


@dataclass
class Outcome:
    """How a run ended: ``code`` 0 done, 1 failed, 2 config invalid, 130 interrupted (Ctrl-C), 143
    terminated (SIGTERM)."""

    code: int
    result: dict[str, Any] | None = None  # run_training's summary (code 0)
    error: str | None = None  # the one message for a run that could not go on
    notice: str | None = None  # printed on stdout (a remote run's Ctrl-C: where it saved)


def run_outcome(cfg: TrainConfig, *, interrupt: Interrupt | None = None) -> Outcome:
    """Run ``cfg`` to its end in a fresh event loop; errors a user can act on become one message."""
    try:
        result = asyncio.run(run_training(cfg, interrupt=interrupt))
    except ConfigError as exc:
        return Outcome(2, error=str(exc))
    except RunError as exc:
        return Outcome(1, error=str(exc))
    except GatewayClientError as exc:  # the gateway refused a control call mid-run (e.g. it restarted)
        return Outcome(1, error=f"the gateway refused a call: {exc}")
    except httpx.HTTPError as exc:  # ... or went away
        return Outcome(1, error=f"lost the gateway: {type(exc).__name__}: {exc}")
    except (KeyboardInterrupt, asyncio.CancelledError):
        return Outcome(130)
    except Terminated:
        return Outcome(143)
    return Outcome(0, result)


def report(outcome: Outcome, command: str = "train") -> int:
    """Print how the run ended; its exit code."""
    if outcome.notice is not None:
        print(outcome.notice, flush=True)
    if outcome.error is not None:
        print(f"rlgate {command}: error: {outcome.error}", file=sys.stderr, flush=True)
    elif outcome.result is not None:
        result = outcome.result
        print(f"done: step {result['steps']}, checkpoint {result['checkpoint']}; "
              f"metrics in {Path(result['out_dir']) / 'metrics.jsonl'}", flush=True)
        print(json.dumps(result), flush=True)
    return outcome.code
