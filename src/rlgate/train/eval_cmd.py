"""``rlgate eval --config FILE.yaml``: the reward of a checkpoint on a dataset, through the same agents.

Serves the checkpoint (default: the run's latest, else ``model``) with the config's
gateway settings — in this process, or pushed to the remote gateway — plays each item
``--samples-per-item`` times at ``--temperature`` (added to each item as
``data["temperature"]``; the agent must honour it), and writes a JSON report
(default ``out_dir/eval-<checkpoint>.json``)::

    {"checkpoint", "dataset", "reward_mean", "reward_std", "reward_mean_failed_as_zero",
     "episodes", "failed", "items", "samples_per_item", "temperature", "seconds",
     "per_item": [{"index", "rewards": [reward | null per sample]}]}

With 0/1 rewards ``reward_mean`` is the accuracy. Every episode failing is an error
(exit 1), never a score of 0.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from rlgate.rollout.errors import RunError
from rlgate.train.checkpoint import latest_checkpoint
from rlgate.train.config import ConfigError, DatasetSource, TrainConfig, load_config
from rlgate.train.loading import load_dataset, resolve_model
from rlgate.train.run import evaluate, make_runner, prepare_start, report_error


async def run_eval(cfg: TrainConfig, *, checkpoint: str | None = None, dataset: str | None = None,
                   samples_per_item: int | None = None, temperature: float | None = None,
                   limit: int | None = None, report: str | None = None, print_fn: Any = print) -> dict[str, Any]:
    from rlgate.train.gateway import GatewayPlan, open_gateway

    prep = await prepare_start(cfg, need_data=False, log=print_fn)
    if checkpoint:
        weights = resolve_model(checkpoint, "--checkpoint")
    else:
        weights = latest_checkpoint(Path(cfg.out_dir)) or prep.model
    if dataset:
        source = DatasetSource(path=dataset, limit=limit)
    elif cfg.eval_dataset is not None:
        source = cfg.eval_dataset.model_copy(update={"limit": limit or cfg.eval_dataset.limit})
    else:
        raise ConfigError("rlgate eval: no dataset: pass --dataset or set eval_dataset in the config")
    items = load_dataset(source, "--dataset" if dataset else "eval_dataset")
    spi = samples_per_item or cfg.eval_samples_per_item
    temp = cfg.eval_temperature if temperature is None else temperature
    served = weights
    from rlgate.train.policy import is_adapter

    if is_adapter(weights):  # a LoRA checkpoint: serve the base with the adapter merged in
        from rlgate.train.policy import merge_adapter

        served = await asyncio.to_thread(merge_adapter, prep.model, weights, Path(cfg.out_dir) / f"merged-{weights.name}")
        print_fn(f"{weights} is a LoRA adapter: serving {prep.model} with it merged ({served})")
    gw = await open_gateway(GatewayPlan.of(cfg), served, prep.model)
    runner = make_runner(cfg, gw.client, prep.agent, prep.reward_fn)
    try:
        if gw.remote and served != prep.model:
            version = await gw.client.update_weights(str(served.resolve()))
            print_fn(f"remote gateway now serves {weights} (version {version})")
        print_fn(f"evaluating {weights} on {source.path}: {len(items)} items x {spi} sample(s) at T={temp:g}")
        t0 = time.perf_counter()
        res = await evaluate(runner, items, samples_per_item=spi, temperature=temp)
        out = {"checkpoint": str(weights), "dataset": source.path, **res.to_dict(),
               "seconds": time.perf_counter() - t0}
    finally:
        await runner.aclose()
        await gw.close()
    path = Path(report) if report else Path(cfg.out_dir) / f"eval-{weights.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print_fn(f"reward_mean {res.reward_mean:.4f} (std {res.reward_std:.4f}) over {res.episodes - res.failed} "
             f"episodes, {res.failed} failed; report: {path}")
    return out


def eval_command(config_path: str, overrides: list[str] | None = None, *, port: int | None = None,
                 **kwargs: Any) -> int:
    try:
        cfg = load_config(config_path, overrides)
        if port is not None:
            cfg.gateway.port = port
        asyncio.run(run_eval(cfg, **kwargs))
        return 0
    except RunError as exc:
        return report_error(exc, "eval")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
