"""``ray.trainer``: the whole run as one Ray actor on the cluster; ``rlgate train`` only waits.

The driver (the ``rlgate train`` process) checks everything it can first, as an in-process run
does: the config (strict), the model path, the datasets, the agent, the reward function, the
trackers (:func:`~rlgate.train.run.prepare`), then whether any node of the cluster can ever hold
the trainer's resource request. Only then it connects to (or starts) Ray and creates a
:class:`TrainerActor` with ``ray.trainer``'s request (``num_cpus``, ``num_gpus``,
``memory_gb``, ``resources``). The actor runs :func:`~rlgate.train.run.run_training` on the
resolved :class:`TrainConfig`: the gateway (in its process, or ``ray.replicas`` replicas), the
model, the optimiser, the loop, the checkpoints; episodes are Ray tasks as without
``ray.trainer``.

* **Output.** The run's lines (steps, evaluations) are the actor's stdout, which Ray forwards
  to the driver (``log_to_driver``; prefixed ``(TrainerActor pid=N)``). How the run ended — the
  summary, the error, where Ctrl-C saved — comes back as the actor call's value and the driver
  prints it, so the last word never depends on log forwarding.
* **Paths.** The actor starts in the driver's working directory and gets the driver's
  ``RLGATE_*``, ``HF_*``, ``TRANSFORMERS_*``, ``WANDB_*``, ``MLFLOW_*`` environment variables,
  so relative paths and keys mean the same there. On a multi-node cluster the model, the
  datasets, ``out_dir`` and the agent's module must be on storage every node reads at the same
  path (on one machine they are); a node that cannot enter that directory fails the run with a
  message saying so.
* **Ctrl-C.** The first asks the actor to stop (:meth:`TrainerActor.stop`: the same stop an
  in-process Ctrl-C makes, so the last completed step is saved) and waits for it; a second
  kills the actor (``ray.kill``). Exit code 130 either way.
* **Failures.** A run that fails in the actor ends with its one message in the driver (exit 1,
  2 for a config error found there); an exception escaping the run, or the actor's death (its
  node lost, out of memory), is reported by its type and message, not Ray's traceback.

The actor is owned by the driver: if ``rlgate train`` dies, Ray ends the actor (and its run).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from rlgate.rollout.errors import RunError
from rlgate.train.config import ConfigError, TrainConfig, TrainerSettings
from rlgate.train.run import Interrupt, Outcome, prepare, run_outcome

ENV_PREFIXES = ("RLGATE_", "HF_", "TRANSFORMERS_", "WANDB_", "MLFLOW_")
POLL_S = 1.0  # how often the driver's wait lets a Ctrl-C through (ray.wait's timeout)


class TrainerActor:
    """The run, in a Ray worker process (created with ``max_concurrency=2``: ``stop`` runs while
    ``run`` does)."""

    def __init__(self, cwd: str, env: dict[str, str]) -> None:
        os.environ.update(env)
        self.cwd = cwd
        self.interrupt = Interrupt()

    def where(self) -> dict[str, Any]:
        """The process the run is in: ``pid``, ``hostname``, Ray ``node_id``."""
        import ray

        return {"pid": os.getpid(), "hostname": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def run(self, raw: dict[str, Any]) -> Outcome:
        """Runs the config (a ``TrainConfig`` dumped to JSON); out_dir/trainer.json says where."""
        try:
            os.chdir(self.cwd)
        except OSError as exc:
            return Outcome(1, error=f"ray.trainer: the trainer's node ({socket.gethostname()}) cannot enter the "
                           f"working directory {self.cwd} ({exc.strerror}); on a multi-node cluster the model, "
                           "datasets, out_dir and agent must be on storage every node reads at the same path")
        cfg = TrainConfig.model_validate(raw)
        out = Path(cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "trainer.json").write_text(json.dumps(self.where()) + "\n")
        outcome = run_outcome(cfg, interrupt=self.interrupt)
        if outcome.code == 130:
            outcome.notice = self.interrupt.message or "\ninterrupted before the first step: nothing to save"
        sys.stdout.flush()
        return outcome

    def stop(self) -> None:
        """Stop the run as Ctrl-C does (the last completed step saved); ``run`` then returns."""
        self.interrupt.request()


def check_feasible(trainer: TrainerSettings, nodes: list[dict[str, Any]]) -> None:
    """RunError unless some alive node (``ray.nodes()``) has all ``ray.trainer`` asks for (else
    Ray would wait for one forever)."""
    want = _request(trainer)
    have = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if any(all(res.get(k, 0.0) >= v for k, v in want.items()) for res in have):
        return
    most = ", ".join(f"{k}={max((r.get(k, 0.0) for r in have), default=0.0):g}" for k in want)
    raise RunError(f"ray.trainer: no node of the Ray cluster has {', '.join(f'{k}={v:g}' for k, v in want.items())} "
                   f"(the most any node has: {most}); lower the request or add such a node")


def _request(trainer: TrainerSettings) -> dict[str, float]:
    want = {"CPU": trainer.num_cpus, "GPU": trainer.num_gpus, **trainer.resources}
    if trainer.memory_gb is not None:
        want["memory"] = trainer.memory_gb * 1024**3
    return {k: v for k, v in want.items() if v > 0}


def _options(trainer: TrainerSettings) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": trainer.num_cpus, "num_gpus": trainer.num_gpus,
                               "max_concurrency": 2, "max_restarts": 0, "max_task_retries": 0}
    if trainer.resources:
        options["resources"] = dict(trainer.resources)
    if trainer.memory_gb is not None:
        options["memory"] = int(trainer.memory_gb * 1024**3)
    return options


def _wait(ray: Any, ref: Any) -> Any:
    """``ray.get(ref)``, waiting in short slices so that a Ctrl-C (KeyboardInterrupt) gets through."""
    while not ray.wait([ref], timeout=POLL_S)[0]:
        pass
    return ray.get(ref)


def _failure(exc: BaseException) -> Outcome:
    """One message for an exception that escaped the actor, or for its death."""
    from ray.exceptions import RayActorError, RayTaskError

    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        what = f"{type(cause).__name__}: {cause}" if cause is not None else first
        return Outcome(1, error=f"the trainer on the Ray cluster failed: {what}")
    if isinstance(exc, RayActorError):
        return Outcome(1, error=f"the trainer on the Ray cluster died (its process or node was lost): {first}")
    return Outcome(1, error=f"the Ray cluster failed: {type(exc).__name__}: {first}")


def _connect(cfg: TrainConfig) -> Any:
    """Checks (``prepare``), Ray joined or started, the request feasible; the ``ray`` module."""
    from rlgate.cluster.launch import init_ray
    from rlgate.train.gateway import ray_cluster_config

    assert cfg.ray is not None and cfg.ray.trainer is not None
    prepare(cfg)  # config errors before anything is submitted
    try:
        init_ray(ray_cluster_config(cfg.ray), log_to_driver=True)
    except Exception as exc:  # noqa: BLE001 - name the setting, not Ray's internals
        raise RunError(f"ray: cannot {'join ' + cfg.ray.address if cfg.ray.address else 'start a local Ray'} "
                       f"({type(exc).__name__}: {exc})") from None
    import ray

    check_feasible(cfg.ray.trainer, ray.nodes())
    return ray


class _SigTerm(KeyboardInterrupt):
    """SIGTERM on the driver: stops the remote run as Ctrl-C does (exit 143)."""

    seen = False  # Ray may turn the exception into a plain KeyboardInterrupt: the note stays


def _raise_sigterm(signum: int, frame: Any) -> None:
    _SigTerm.seen = True
    raise _SigTerm


def run_remote(cfg: TrainConfig) -> Outcome:
    """Check ``cfg`` here, run it as a :class:`TrainerActor` on the Ray cluster, wait for its outcome.
    Ctrl-C or SIGTERM stops it (its last completed step saved); a second one kills the actor."""
    import signal
    import threading

    try:
        ray = _connect(cfg)
    except RunError as exc:
        return Outcome(2 if isinstance(exc, ConfigError) else 1, error=str(exc))
    main = threading.current_thread() is threading.main_thread()
    _SigTerm.seen = False
    previous = signal.signal(signal.SIGTERM, _raise_sigterm) if main else None  # after ray.init, which sets its own
    try:
        return _run_remote(cfg, ray)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _run_remote(cfg: TrainConfig, ray: Any) -> Outcome:
    assert cfg.ray is not None and cfg.ray.trainer is not None
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    actor = ray.remote(TrainerActor).options(**_options(cfg.ray.trainer)).remote(os.getcwd(), env)
    run = actor.run.remote(cfg.model_dump(mode="json"))
    stopping = terminated = False
    while True:
        try:
            if not stopping:
                where = _wait(ray, actor.where.remote())
                print(f"trainer: on the Ray cluster, pid {where['pid']} on {where['hostname']} "
                      f"(node {where['node_id'][:12]})", flush=True)
            outcome: Outcome = _wait(ray, run)
            if terminated and outcome.code == 130:
                outcome.code = 143
                if outcome.notice:
                    outcome.notice = outcome.notice.replace("interrupted", "terminated (SIGTERM)", 1)
            return outcome
        except KeyboardInterrupt as exc:
            if stopping:  # the second Ctrl-C (or SIGTERM)
                ray.kill(actor, no_restart=True)
                print("killed the trainer; out_dir/checkpoints/latest names its last checkpoint",
                      file=sys.stderr, flush=True)
                return Outcome(143 if isinstance(exc, _SigTerm) or _SigTerm.seen else 130)
            stopping = True
            terminated = isinstance(exc, _SigTerm) or _SigTerm.seen
            actor.stop.remote()
            print("\nstopping the trainer on the Ray cluster (it saves its last completed step); "
                  "Ctrl-C (or SIGTERM) again to kill it", file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 - the actor raised or died: one message, not Ray's traceback
            return _failure(exc)
