"""``rlgate`` command line: serve, tiny-model, demo, train, check, eval, view."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

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


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (tokenizer + weights; "
                   "with --engine fake/sglang/vllm only the tokenizer is needed)")
    p.add_argument("--engine", choices=["local", "fake", "sglang", "vllm"], default="local",
                   help="local: PyTorch in this process; fake: scripted; sglang / vllm: drive inference servers "
                   "(--backend-url)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--admin-key", default=None, help="admin key (default: $RLGATE_ADMIN_KEY, else generated)")
    p.add_argument("--admin-key-file", default=None, help="write the (generated) admin key to this file, mode 0600")
    p.add_argument("--capacity-mode", choices=["unlimited", "granted"], default="unlimited")
    p.add_argument("--trajectory-mode", choices=["token_exact", "rerender"], default="token_exact")
    p.add_argument("--renderer", default="auto",
                   help="model family: renderer, parsers and stop tokens ('auto': detected from config.json and the "
                        "chat template; 'jinja': the checkpoint's own template), e.g. qwen3, llama3, gpt_oss")
    p.add_argument("--tool-parser", default="auto", help="tool-call parser ('auto': the family's; 'none' to disable)")
    p.add_argument("--reasoning-parser", default="auto",
                   help="reasoning parser ('auto': the family's; 'none' to disable), e.g. 'think'")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--default-max-tokens", type=int, default=512)
    p.add_argument("--max-tokens-cap", type=int, default=None)
    p.add_argument("--model-name", default=None, help="name listed by /v1/models (default: directory name)")
    p.add_argument("--fake-output-tokens", type=int, default=16, help="--engine fake: tokens per reply")
    p.add_argument("--fake-token-delay", type=float, default=0.0, help="--engine fake: seconds between tokens")
    p.add_argument("--device", default=None, help="--engine local: torch device (default cuda if available)")
    p.add_argument("--max-batch-size", type=int, default=64, help="--engine local: concurrent sequences")
    p.add_argument("--max-rows-per-session", type=int, default=None,
                   help="--engine local: batch rows one session may hold (default: half of --max-batch-size)")
    from rlgate.engine.remote.options import add_remote_args

    add_remote_args(p)
    p.add_argument("--store", default=os.environ.get("RLGATE_STORE"),
                   help="SQLite file for sessions and trajectories, or ':memory:' (keep nothing) "
                   "(default: $RLGATE_STORE, else DATA_DIR/rlgate.sqlite)")
    p.add_argument("--data-dir", default=None,
                   help="server data directory (default: $RLGATE_DATA_DIR, else $XDG_DATA_HOME/rlgate, "
                   "else ~/.local/share/rlgate)")
    p.add_argument("--store-sync", choices=["full", "normal"], default="full",
                   help="full: fsync every commit (survives power loss); normal: survives a gateway crash only")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="SIGTERM: seconds requests in flight get to finish")
    p.add_argument("--session-idle-timeout", type=float, default=3600.0)
    p.add_argument("--sweep-interval", type=float, default=60.0, help="seconds between idle-session sweeps")
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--max-stored-sessions", type=int, default=100_000)
    p.add_argument("--max-interactions-per-session", type=int, default=10_000)
    p.add_argument("--max-concurrent-requests-per-session", type=int, default=64)
    p.add_argument("--max-messages-per-request", type=int, default=10_000)
    p.add_argument("--max-tools", type=int, default=512)
    p.add_argument("--max-stop-sequences", type=int, default=16)
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument("--retain-exported", type=float, default=0.0)
    from rlgate.config import GatewayConfig

    p.add_argument("--stream-keepalive-interval", type=float, default=GatewayConfig.stream_keepalive_interval,
                   help="seconds without a streamed event before a keep-alive event (ping) is sent; 0: never")
    p.add_argument("--cors-origin", action="append", default=[], help="allow this CORS origin (repeatable)")
    # no "trace": uvicorn logs raw request headers (keys) at that level
    p.add_argument("--log-level", default="info", type=str.lower,
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log one line per request (never keys)")
    add_config_args(p, OBSERVABILITY_FIELDS + HARDENING_FIELDS)
    add_cluster_args(p)


# GatewayConfig fields whose flags are made from the field's metadata["help"] and default
OBSERVABILITY_FIELDS = ("metrics_port", "metrics_host", "ui", "ui_login_ttl", "guard_window", "guard_min_events",
                        "guard_poll_interval", "guard_tool_parse_failure_ratio", "guard_unparsed_tool_markup_ratio",
                        "guard_empty_reply_ratio", "guard_fork_ratio", "guard_unaligned_turn_ratio",
                        "guard_missing_reward_ratio", "guard_stale_lag", "guard_stale_token_ratio",
                        "guard_abort_ratio", "guard_store_failure_ratio")
# the bounds of docs/operations.md "Limits" that issue 15 added (docs/security.md)
HARDENING_FIELDS = ("allow_template_override", "render_timeout", "render_workers", "max_json_depth",
                    "max_image_bytes", "max_image_bytes_per_session", "rate_limit_per_key", "rate_limit_burst",
                    "header_timeout", "body_timeout", "max_buffered_body_bytes", "max_connections")


def add_config_args(p: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """``--field-name`` flags for GatewayConfig fields: default, type and help from the dataclass."""
    import dataclasses

    from rlgate.config import GatewayConfig

    fields = {f.name: f for f in dataclasses.fields(GatewayConfig)}
    for name in names:
        f = fields[name]
        flag = "--" + name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if isinstance(f.default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            kind = type(f.default) if f.default is not None else int
            p.add_argument(flag, type=kind, default=f.default, help=f"{help_text} (default: {f.default})")


def config_values(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(args, n) for n in names}


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--replicas``, ``--ray-address``, ...: one flag per :class:`~rlgate.config.ClusterConfig` field."""
    import dataclasses
    import typing

    from rlgate.config import ClusterConfig

    g = p.add_argument_group("replicas on Ray (see docs/scale-out.md)")
    hints = typing.get_type_hints(ClusterConfig)
    for f in dataclasses.fields(ClusterConfig):
        kind = next((t for t in (int, float, str) if t is hints[f.name] or t in typing.get_args(hints[f.name])), str)
        g.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default, help=f.metadata["help"])


def cluster_config(args: argparse.Namespace) -> Any:
    import dataclasses

    from rlgate.config import ClusterConfig

    return ClusterConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ClusterConfig)})


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


def gateway_config(args: argparse.Namespace, admin_key: str) -> Any:
    from rlgate.config import GatewayConfig

    return GatewayConfig(
        admin_key=admin_key,
        capacity_mode=args.capacity_mode,
        trajectory_mode=args.trajectory_mode,
        model_family=None if args.renderer in (None, "auto") else args.renderer,
        tool_parser=None if args.tool_parser in (None, "none") else args.tool_parser,
        reasoning_parser=None if args.reasoning_parser in (None, "none") else args.reasoning_parser,
        default_max_tokens=args.default_max_tokens,
        max_tokens_cap=args.max_tokens_cap,
        context_length=args.context_length,
        model_name=args.model_name or Path(args.model).resolve().name,
        session_idle_timeout=args.session_idle_timeout,
        sweep_interval=args.sweep_interval,
        max_sessions=args.max_sessions,
        max_stored_sessions=args.max_stored_sessions,
        max_interactions_per_session=args.max_interactions_per_session,
        max_concurrent_requests_per_session=args.max_concurrent_requests_per_session,
        max_messages_per_request=args.max_messages_per_request,
        max_tools=args.max_tools,
        max_stop_sequences=args.max_stop_sequences,
        max_body_bytes=args.max_body_bytes,
        retain_exported=args.retain_exported,
        stream_keepalive_interval=args.stream_keepalive_interval,
        shutdown_timeout=args.shutdown_timeout,
        cors_origins=list(args.cors_origin),
        **config_values(args, OBSERVABILITY_FIELDS + HARDENING_FIELDS),
    )


def build_app(args: argparse.Namespace, admin_key: str) -> Any:
    from rlgate.model import context_length, load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store import StoreError, open_store

    tokenizer = load_tokenizer(args.model)
    config = gateway_config(args, admin_key)
    engine: Any
    if args.engine == "fake":
        from rlgate.engine.fake import FakeEngine

        engine = FakeEngine(tokenizer, output_tokens=args.fake_output_tokens, token_delay=args.fake_token_delay,
                            max_context_length=args.context_length or context_length(args.model) or 32768)
    elif args.engine in ("sglang", "vllm"):  # only the tokenizer is loaded in this process
        from rlgate.engine.remote.options import remote_engine_from_args

        engine = remote_engine_from_args(args, fallback_context=args.context_length or context_length(args.model))
    else:
        from rlgate.engine.local import LocalEngine

        engine = LocalEngine(args.model, device=args.device, max_batch_size=args.max_batch_size,
                             max_context_length=args.context_length, max_rows_per_session=args.max_rows_per_session)
    try:
        store = open_store(args.store, data_dir=args.data_dir, synchronous=args.store_sync)
    except StoreError as exc:
        raise SystemExit(f"rlgate: {exc}") from exc
    logging.getLogger("rlgate").info("store: %s", getattr(store, "path", ":memory: (nothing is persisted)"))
    try:
        app = create_app(config, engine, store, tokenizer, stop_token_ids=stop_token_ids(tokenizer, args.model))
    except (StoreError, ValueError) as exc:  # the store file could not be loaded; an unknown --renderer / parser
        store.close()
        raise SystemExit(f"rlgate: {exc}") from exc
    except BaseException:
        store.close()
        raise
    gen = app.state.gateway.generation
    print(f"rlgate: model family {gen.family.title} ({gen.family.name}); renderer {gen.renderer.name}; "
          f"tool parser {gen.tool_parser or 'none'}; reasoning parser {gen.reasoning_parser or 'none'}", flush=True)
    return app


def write_secret_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 without following a link planted at ``path``:
    a new file is written next to it (created 0600, exclusively) and renamed over the path,
    which replaces a symlink itself rather than the file it points to."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cmd_serve(args: argparse.Namespace) -> int:
    _offline_env()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    admin_key, generated = resolve_admin_key(args)
    if args.admin_key_file:
        write_secret_file(Path(args.admin_key_file), admin_key + "\n")
    if generated:
        if args.admin_key_file:
            print(f"rlgate: generated an admin key; written to {args.admin_key_file} (mode 0600)", flush=True)
        else:
            print(f"rlgate: generated admin key (shown once): {admin_key}", flush=True)
    if args.replicas > 0:
        return serve_cluster(args, admin_key)
    app = build_app(args, admin_key)
    from rlgate.server.serve import serve

    return serve(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log,
                 shutdown_timeout=args.shutdown_timeout)


def engine_spec(args: argparse.Namespace, replicas: int) -> Any:
    """What each replica builds (``rlgate.cluster.engines``) from ``rlgate serve``'s engine flags."""
    from rlgate.cluster.engines import FakeEngineSpec, LocalEngineSpec, RemoteEngineSpec
    from rlgate.model import context_length

    if args.engine == "fake":
        return FakeEngineSpec(output_tokens=args.fake_output_tokens, token_delay=args.fake_token_delay,
                              max_context_length=args.context_length or context_length(args.model) or 32768)
    if args.engine == "local":
        return LocalEngineSpec(str(Path(args.model).resolve()), device=args.device,
                               max_batch_size=args.max_batch_size, max_context_length=args.context_length)
    from rlgate.engine.remote.options import remote_engine_options

    if not args.backend_url:
        raise SystemExit(f"rlgate: --engine {args.engine} needs at least one --backend-url")
    urls = list(args.backend_url)
    # replica i drives the backends i, i+N, ...; with fewer backends than replicas they are shared
    shares = [urls[i::replicas] or [urls[i % len(urls)]] for i in range(replicas)]
    return RemoteEngineSpec(args.engine, shares, remote_engine_options(
        args, fallback_context=args.context_length or context_length(args.model)))


def serve_cluster(args: argparse.Namespace, admin_key: str) -> int:
    """``rlgate serve --replicas N``: N replicas on Ray, this process runs the router."""
    from rlgate.cluster.launch import Cluster
    from rlgate.cluster.replica import ReplicaSpec
    from rlgate.server.serve import KEEP_ALIVE_S
    from rlgate.store import default_data_dir

    cfg = cluster_config(args)
    if args.store not in (None, ":memory:"):
        raise SystemExit("rlgate: with --replicas each replica keeps its own store under --data-dir "
                         "(DATA_DIR/replica-<i>/rlgate.sqlite); --store accepts only ':memory:' there")
    data_dir = None if args.store == ":memory:" else str(Path(args.data_dir or default_data_dir()).resolve())
    spec = ReplicaSpec(model=str(Path(args.model).resolve()), config=gateway_config(args, admin_key),
                       engine=engine_spec(args, cfg.replicas), data_dir=data_dir, store_sync=args.store_sync,
                       host=cfg.replica_host, log_level="warning" if args.log_level == "info" else args.log_level)
    cluster = Cluster(spec, cfg)
    try:
        cluster.start()
        import uvicorn

        from rlgate.server.serve import GatewayServer

        print(f"rlgate: {cfg.replicas} replicas up; router on http://{args.host}:{args.port}", flush=True)
        GatewayServer(uvicorn.Config(cluster.make_router(), host=args.host, port=args.port, log_level=args.log_level,
                                     access_log=args.access_log, timeout_keep_alive=KEEP_ALIVE_S, lifespan="on"),
                      None).run()
    finally:
        cluster.stop()
        import ray

        ray.shutdown()
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
    _offline_env()
    if args.scripted:
        from rlgate.demo.scripted import run_scripted_demo

        return run_scripted_demo(Path(args.out), seed=args.seed)
    from rlgate.demo.rl import run_demo

    return run_demo(Path(args.out), task=args.task, seed=args.seed, steps=args.steps, port=args.port,
                    metrics_port=args.metrics_port, pushgateway=args.pushgateway,
                    gateway_metrics_port=args.gateway_metrics_port)


def _train_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_train(args: argparse.Namespace) -> int:
    _offline_env()
    _train_logging()
    if args.check:
        from rlgate.train.check import run_check

        return run_check(args.config, args.set, episodes=args.episodes, port=args.port)
    from rlgate.train.run import train_command

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
                   help="port of the in-process gateway on 127.0.0.1 (default: gateway.port, else a free one)")


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
    p.add_argument("--task", choices=["math", "tools"], default="math")
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
    p.add_argument("--stale-lag", type=int, default=4, help="flag tokens more than N versions behind")
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_view)

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
