"""``rlgate train --config FILE.yaml``: GRPO on any Hugging Face checkpoint directory.

One pydantic config (:class:`TrainConfig`) read from YAML, with ``--set key=value``
overrides (dotted keys, YAML values: ``--set grpo.lr=1e-5 --set steps=200``)::

    model: /models/Qwen2.5-0.5B-Instruct
    out_dir: runs/math
    dataset: data/train.jsonl            # one JSON object per line, passed to the agent
    eval_dataset: data/test.jsonl        # optional; evaluated at temperature 0
    agent: rlgate.demo.math_agent:OpenAIMathAgent
    agent_kwargs: {max_tokens: 256}
    steps: 200
    grpo: {lr: 1.0e-6, groups_per_step: 16, max_staleness: 1}
    rollout: {group_size: 8, concurrency: 64, export_style: individual}
    gateway: {}                          # in-process gateway + local engine (colocated sync)
    metrics: {port: 9400}                # Prometheus: per-step gauges (+ the in-process gateway's)
    # gateway: {url: http://gpu-box:8000, sync_dir: /shared/ckpt}   # remote gateway
    # ray: {replicas: 4, address: auto, episode: {num_cpus: 1}}       # replicas + rollouts on Ray

Checkpoints (model, tokenizer, optimiser, loop state) go to
``out_dir/checkpoints/step-N``; with ``resume: true`` (default) a rerun continues from
the latest one, and the gateway is given the checkpoint's weights first. Metrics are
appended to ``out_dir/metrics.jsonl``. The agent is imported from the config file (your
own code, on your machine); nothing is imported because of an HTTP request.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import secrets
import shutil
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from rlgate.train.grpo import GRPOConfig
from rlgate.train.telemetry import MetricsSettings


class RolloutSettings(BaseModel):
    group_size: int = Field(default=8, ge=1)
    concurrency: int = Field(default=64, ge=1)
    episode_timeout: float = 300.0
    mode: Literal["inline", "subprocess"] = "inline"
    export_style: Literal["individual", "concat"] = "individual"
    discount: float = Field(default=1.0, ge=0.0, le=1.0)


class GatewaySettings(BaseModel):
    url: str | None = None  # a running gateway (weights pushed as checkpoints); None: start one here
    admin_key: str | None = None  # default: $RLGATE_ADMIN_KEY (remote gateway only)
    sync_dir: str | None = None  # remote: a directory the gateway can read (default out_dir/sync)
    tool_parser: str | None = "hermes"  # in-process gateway settings
    reasoning_parser: str | None = None
    trajectory_mode: Literal["token_exact", "rerender"] = "token_exact"
    context_length: int | None = None
    device: str | None = None


class RaySettings(BaseModel):
    """Run on a Ray cluster: rollouts as Ray tasks (``rollout.mode`` becomes ``ray``) and, with
    ``replicas``, the gateway as that many replicas behind a router in this process (each with a
    local engine on ``replica_num_gpus`` GPUs), weights synced through the router's controller."""

    model_config = {"extra": "forbid"}

    address: str | None = None  # an existing cluster ("auto", HOST:6379); None: start a local one
    num_cpus: int | None = None  # local cluster only: CPUs it may schedule
    replicas: int = Field(default=0, ge=0)  # 0: the gateway as configured in `gateway:`
    replica_num_cpus: float = Field(default=1.0, ge=0)
    replica_num_gpus: float = Field(default=0.0, ge=0)
    replica_host: str = "127.0.0.1"  # 0.0.0.0 when replicas run on other nodes
    episode: dict[str, Any] = Field(default_factory=lambda: {"num_cpus": 1})  # each episode's resource request
    data_dir: str | None = None  # replicas' stores (default out_dir/replicas; must be on each node)


class TrainConfig(BaseModel):
    model: str
    out_dir: str = "runs/rlgate"
    dataset: str
    eval_dataset: str | None = None
    eval_every: int = 0  # steps; 0: only at the start and the end
    agent: str  # "package.module:attribute" (a class, instantiated with agent_kwargs, or an object)
    agent_kwargs: dict[str, Any] = Field(default_factory=dict)
    steps: int = Field(default=100, ge=0)
    seed: int = 0
    checkpoint_every: int = Field(default=10, ge=1)
    resume: bool = True
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    ray: RaySettings | None = None
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)  # Prometheus port / Pushgateway


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        node = raw
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _scalar(yaml.safe_load(value))
    return raw


def _scalar(v: Any) -> Any:
    """YAML 1.1 reads ``3e-5`` as a string; numbers written that way are numbers here."""
    if isinstance(v, str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
    return v


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    return TrainConfig.model_validate(apply_overrides(raw, overrides or []))


def load_agent(spec: str, kwargs: dict[str, Any]) -> Any:
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"agent must look like 'package.module:Name', got {spec!r}")
    obj = getattr(importlib.import_module(module_name), attr)
    return obj(**kwargs) if isinstance(obj, type) else obj


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint(out_dir: Path) -> Path | None:
    marker = out_dir / "checkpoints" / "latest"
    if marker.is_file():
        path = out_dir / "checkpoints" / marker.read_text().strip()
        if (path / "trainer_state.pt").is_file():
            return path
    return None


def save_checkpoint(out_dir: Path, trainer: Any, state: Any, tokenizer_dir: Path) -> Path:
    import torch

    path = out_dir / "checkpoints" / f"step-{state.step:06d}"
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                 "generation_config.json"):
        if (tokenizer_dir / name).is_file() and not (tmp / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    torch.save({"optimizer": trainer.optimizer.state_dict(), "step": state.step, "version": state.version,
                "history": state.history}, tmp / "trainer_state.pt")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    (out_dir / "checkpoints" / "latest").write_text(path.name)
    return path


# --------------------------------------------------------------------------- the run


async def _train(cfg: TrainConfig) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.client import GatewayClient
    from rlgate.rollout.runner import RolloutRunner
    from rlgate.train.grpo import GRPOTrainer, LoopState, grpo_loop
    from rlgate.train.sync import ColocatedSync, RemoteSync

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    saved_cfg = cfg.model_dump(mode="json")
    if saved_cfg["gateway"].get("admin_key"):
        saved_cfg["gateway"]["admin_key"] = "<redacted>"  # keys are never written out
    (out / "config.yaml").write_text(yaml.safe_dump(saved_cfg, sort_keys=False))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ckpt = latest_checkpoint(out) if cfg.resume else None
    weights = ckpt or Path(cfg.model)
    model = AutoModelForCausalLM.from_pretrained(weights)
    # the KL reference is the starting model, also when resuming from a checkpoint
    ref = AutoModelForCausalLM.from_pretrained(cfg.model) if ckpt is not None and cfg.grpo.kl_coef > 0 else None
    trainer = GRPOTrainer(model, cfg.grpo, ref_model=ref)
    state = LoopState()
    if ckpt is not None:
        saved = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        trainer.optimizer.load_state_dict(saved["optimizer"])
        state.step, state.history = saved["step"], saved["history"]
        print(f"resuming from {ckpt} (step {state.step})")

    gateway_registries: tuple[Any, ...] = ()
    server = engine = cluster = None
    sync: Any
    if cfg.ray is not None:
        from rlgate.cluster.launch import init_ray
        from rlgate.config import ClusterConfig

        init_ray(ClusterConfig(ray_address=cfg.ray.address, ray_num_cpus=cfg.ray.num_cpus))
    if cfg.ray is not None and cfg.ray.replicas > 0:
        cluster, client = _start_cluster(cfg, out)
        sync = RemoteSync(client, cfg.gateway.sync_dir or out / "sync")
        if ckpt is not None:
            await sync.push(trainer.model)
    elif cfg.gateway.url:
        admin_key = cfg.gateway.admin_key or os.environ.get("RLGATE_ADMIN_KEY")
        if not admin_key:
            raise SystemExit("gateway.url needs gateway.admin_key or $RLGATE_ADMIN_KEY")
        client = GatewayClient(cfg.gateway.url, admin_key)
        sync = RemoteSync(client, cfg.gateway.sync_dir or out / "sync")
        if ckpt is not None:
            await sync.push(trainer.model)  # the gateway must serve the resumed weights
    else:
        from rlgate.config import GatewayConfig
        from rlgate.engine.local import LocalEngine
        from rlgate.model import load_tokenizer, stop_token_ids
        from rlgate.server.app import create_app
        from rlgate.server.runner import ServerThread
        from rlgate.store.base import MemoryStore

        admin_key = secrets.token_urlsafe(32)
        tokenizer = load_tokenizer(cfg.model)
        engine = LocalEngine(weights, device=cfg.gateway.device)
        app = create_app(
            GatewayConfig(admin_key=admin_key, capacity_mode="granted", tool_parser=cfg.gateway.tool_parser,
                          reasoning_parser=cfg.gateway.reasoning_parser, trajectory_mode=cfg.gateway.trajectory_mode,
                          context_length=cfg.gateway.context_length, model_name=Path(cfg.model).name),
            engine, MemoryStore(), tokenizer, stop_token_ids=stop_token_ids(tokenizer, cfg.model))
        server = ServerThread(app)
        client = GatewayClient(server.start(), admin_key)
        gateway_registries = (app.state.gateway.metrics.registry,)
        sync = ColocatedSync(engine)

    agent = load_agent(cfg.agent, cfg.agent_kwargs)
    runner = RolloutRunner(client, agent, group_size=cfg.rollout.group_size, concurrency=cfg.rollout.concurrency,
                           episode_timeout=cfg.rollout.episode_timeout,
                           mode="ray" if cfg.ray is not None else cfg.rollout.mode,
                           ray_options=cfg.ray.episode if cfg.ray is not None else None,
                           export_style=cfg.rollout.export_style, discount=cfg.rollout.discount)
    data = read_jsonl(cfg.dataset)
    eval_data = [{**d, "temperature": 0.0} for d in read_jsonl(cfg.eval_dataset)] if cfg.eval_dataset else []

    async def evaluate() -> float | None:
        if not eval_data:
            return None
        eps = await runner.evaluate(eval_data)
        return sum(e.reward or 0.0 for e in eps) / len(eps)

    def prompts():
        rng = random.Random(cfg.seed + state.step)  # a resumed run does not replay the same order
        i = 0
        while True:
            order = list(range(len(data)))
            rng.shuffle(order)
            for j in order:
                yield f"s{state.step}-g{i}", data[j]
                i += 1

    from rlgate.train.telemetry import StepExporter

    exporter = StepExporter(cfg.metrics, extra_registries=gateway_registries)
    if exporter.url:
        print(f"metrics: {exporter.url}")
    metrics_file = (out / "metrics.jsonl").open("a")
    try:
        state.version = (await client.health())["version"]
        first_eval = await evaluate()
        if first_eval is not None:
            print(f"eval accuracy at step {state.step}: {first_eval:.3f}")

        async def on_step(st: LoopState, m: dict[str, float]) -> None:
            if cfg.eval_every and st.step % cfg.eval_every == 0:
                accuracy = await evaluate()
                if accuracy is not None:
                    m["eval_accuracy"] = accuracy
            metrics_file.write(json.dumps(m) + "\n")
            metrics_file.flush()
            await exporter.step(st.step, m, st.version)
            print(f"step {st.step}: reward {m['reward']:.3f} loss {m['loss']:.4f} "
                  f"({m['rollout_s']:.1f} s rollout, {m['train_s']:.1f} s train)")
            if st.step % cfg.checkpoint_every == 0:
                save_checkpoint(out, trainer, st, Path(cfg.model))

        remaining = max(0, cfg.steps - state.step)
        state = await grpo_loop(trainer=trainer, runner=runner, sync=sync, prompts=prompts(), steps=remaining,
                                state=state, on_step=on_step)
        save_checkpoint(out, trainer, state, Path(cfg.model))
        final_eval = await evaluate()
        return {"steps": state.step, "version": state.version, "eval_start": first_eval, "eval_end": final_eval}
    finally:
        metrics_file.close()
        exporter.close()
        await runner.aclose()
        await client.aclose()
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.stop()


def _start_cluster(cfg: TrainConfig, out: Path) -> tuple[Any, Any]:
    """Gateway replicas with local engines on Ray, a router in this process; (cluster, client)."""
    from rlgate.client import GatewayClient
    from rlgate.cluster.engines import LocalEngineSpec
    from rlgate.cluster.launch import Cluster
    from rlgate.cluster.replica import ReplicaSpec
    from rlgate.config import ClusterConfig, GatewayConfig

    assert cfg.ray is not None
    admin_key = secrets.token_urlsafe(32)
    model = str(Path(cfg.model).resolve())
    spec = ReplicaSpec(
        model=model,
        config=GatewayConfig(admin_key=admin_key, capacity_mode="granted", tool_parser=cfg.gateway.tool_parser,
                             reasoning_parser=cfg.gateway.reasoning_parser, trajectory_mode=cfg.gateway.trajectory_mode,
                             context_length=cfg.gateway.context_length, model_name=Path(cfg.model).name),
        engine=LocalEngineSpec(model, device=cfg.gateway.device), host=cfg.ray.replica_host,
        data_dir=str(Path(cfg.ray.data_dir or out / "replicas").resolve()))
    cluster = Cluster(spec, ClusterConfig(replicas=cfg.ray.replicas, ray_address=cfg.ray.address,
                                          replica_num_cpus=cfg.ray.replica_num_cpus,
                                          replica_num_gpus=cfg.ray.replica_num_gpus,
                                          replica_host=cfg.ray.replica_host))
    cluster.start()
    return cluster, GatewayClient(cluster.start_router(), admin_key)


def run_training(config_path: str, overrides: list[str] | None = None) -> int:
    cfg = load_config(config_path, overrides)
    result = asyncio.run(_train(cfg))
    print(json.dumps(result))
    return 0
