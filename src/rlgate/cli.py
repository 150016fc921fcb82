"""``rlgate`` command line: serve, tiny-model, demo, train."""

from __future__ import annotations

import argparse
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


# --------------------------------------------------------------------------- serve


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (tokenizer + weights; "
                   "with --engine fake/sglang/vllm only the tokenizer is needed)")
    p.add_argument("--engine", choices=["local", "fake"], default="local")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--admin-key", default=None, help="admin key (default: $RLGATE_ADMIN_KEY, else generated)")
    p.add_argument("--admin-key-file", default=None, help="write the (generated) admin key to this file, mode 0600")
    p.add_argument("--capacity-mode", choices=["unlimited", "granted"], default="unlimited")
    p.add_argument("--trajectory-mode", choices=["token_exact", "rerender"], default="token_exact")
    p.add_argument("--tool-parser", default="hermes", help="tool-call parser ('none' to disable)")
    p.add_argument("--reasoning-parser", default=None, help="reasoning parser, e.g. 'think'")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--default-max-tokens", type=int, default=512)
    p.add_argument("--max-tokens-cap", type=int, default=None)
    p.add_argument("--model-name", default=None, help="name listed by /v1/models (default: directory name)")
    p.add_argument("--fake-output-tokens", type=int, default=16, help="--engine fake: tokens per reply")
    p.add_argument("--device", default=None, help="--engine local: torch device (default cuda if available)")
    p.add_argument("--max-batch-size", type=int, default=64, help="--engine local: concurrent sequences")
    p.add_argument("--session-idle-timeout", type=float, default=3600.0)
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--max-interactions-per-session", type=int, default=10_000)
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument("--retain-exported", type=float, default=0.0)
    p.add_argument("--cors-origin", action="append", default=[], help="allow this CORS origin (repeatable)")
    p.add_argument("--log-level", default="info")


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


def build_app(args: argparse.Namespace, admin_key: str) -> Any:
    from rlgate.config import GatewayConfig
    from rlgate.model import context_length, load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    tokenizer = load_tokenizer(args.model)
    config = GatewayConfig(
        admin_key=admin_key,
        capacity_mode=args.capacity_mode,
        trajectory_mode=args.trajectory_mode,
        tool_parser=None if args.tool_parser in (None, "none") else args.tool_parser,
        reasoning_parser=args.reasoning_parser,
        default_max_tokens=args.default_max_tokens,
        max_tokens_cap=args.max_tokens_cap,
        context_length=args.context_length,
        model_name=args.model_name or Path(args.model).resolve().name,
        session_idle_timeout=args.session_idle_timeout,
        max_sessions=args.max_sessions,
        max_interactions_per_session=args.max_interactions_per_session,
        max_body_bytes=args.max_body_bytes,
        retain_exported=args.retain_exported,
        cors_origins=list(args.cors_origin),
    )
    engine: Any
    if args.engine == "fake":
        from rlgate.engine.fake import FakeEngine

        engine = FakeEngine(tokenizer, output_tokens=args.fake_output_tokens,
                            max_context_length=args.context_length or context_length(args.model) or 32768)
    else:
        from rlgate.engine.local import LocalEngine

        engine = LocalEngine(args.model, device=args.device, max_batch_size=args.max_batch_size,
                             max_context_length=args.context_length)
    return create_app(config, engine, MemoryStore(), tokenizer, stop_token_ids=stop_token_ids(tokenizer, args.model))


def cmd_serve(args: argparse.Namespace) -> int:
    _offline_env()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    admin_key, generated = resolve_admin_key(args)
    if args.admin_key_file:
        path = Path(args.admin_key_file)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(admin_key + "\n")
        os.chmod(path, 0o600)
    if generated:
        if args.admin_key_file:
            print(f"rlgate: generated an admin key; written to {args.admin_key_file} (mode 0600)", flush=True)
        else:
            print(f"rlgate: generated admin key (shown once): {admin_key}", flush=True)
    app = build_app(args, admin_key)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), access_log=False,
                timeout_graceful_shutdown=30)
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
    from rlgate.demo.scripted import run_scripted_demo

    return run_scripted_demo(Path(args.out), seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway")
    add_serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("tiny-model", help="build the tiny offline model into DIR")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_tiny_model)

    p = sub.add_parser("demo", help="run the offline demo")
    p.add_argument("--out", default="demo-out")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
