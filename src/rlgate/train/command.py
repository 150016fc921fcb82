"""The ``rlgate train`` command: load the config, run it here or (``ray.trainer``) on the Ray
cluster (train/remote.py), print how it ended, return the exit code."""

from __future__ import annotations

from rlgate.rollout.errors import RunError
from rlgate.train.config import load_config
from rlgate.train.run import report, report_error, run_outcome


def train_command(config_path: str, overrides: list[str] | None = None, *, port: int | None = None) -> int:
    """The ``rlgate train`` command: 0 done, 1 the run failed, 2 the config is invalid, 130 Ctrl-C.
    With ``ray.trainer`` the run goes to the Ray cluster (train/remote.py) and this process waits."""
    try:
        cfg = load_config(config_path, overrides)
        if port is not None:
            cfg.gateway.port = port
    except RunError as exc:
        return report_error(exc)
    if cfg.ray is not None and cfg.ray.trainer is not None:
        from rlgate.train.remote import run_remote

        return report(run_remote(cfg))
    return report(run_outcome(cfg))
