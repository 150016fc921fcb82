"""``rlgate demo``: which demo the flags choose (the real model's math or tools task, the tiny model's,
the scripted session), and Ctrl+C as one line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run_demo_command(args: argparse.Namespace) -> int:
    """Ctrl+C stops a demo with one line and exit code 130 (the gateway it started is stopped first)."""
    try:
        return _run_demo(args)
    except KeyboardInterrupt:
        print(f"rlgate demo: stopped (Ctrl+C); what is cached in {args.out} (model, warm start) is kept",
              file=sys.stderr, flush=True)
        return 130


def _run_demo(args: argparse.Namespace) -> int:
    if args.scripted:
        from rlgate.demo.scripted import run_scripted_demo

        return run_scripted_demo(Path(args.out), seed=args.seed, port=args.port)
    if args.engine != "local" and (args.model == "tiny" or args.task != "math" or args.device != "cpu"):
        raise SystemExit(f"rlgate demo: --engine {args.engine} runs the real model's math task on the CPU")
    if args.device != "cpu":
        from rlgate.demo.device import check_device

        check_device(args.device)  # refused in one line before anything loads
    if args.model != "tiny":
        if args.metrics_port is not None or args.pushgateway or args.gateway_metrics_port is not None:
            raise SystemExit("rlgate demo: the metrics flags run on the tiny model (--model tiny)")
        if args.task == "tools":
            from rlgate.demo.real_tools import run_real_tools_demo

            return run_real_tools_demo(Path(args.out), model=args.model, seed=args.seed, steps=args.steps,
                                       port=args.port, device=args.device)
        from rlgate.demo.real import run_real_demo

        return run_real_demo(Path(args.out), model=args.model, seed=args.seed, steps=args.steps, port=args.port,
                             device=args.device, engine=args.engine)
    if args.device != "cpu":
        raise SystemExit("rlgate demo: --device runs a real model (the tiny model trains on the CPU)")
    from rlgate.demo.rl import run_demo

    return run_demo(Path(args.out), task=args.task, seed=args.seed, steps=args.steps, port=args.port,
                    metrics_port=args.metrics_port, pushgateway=args.pushgateway,
                    gateway_metrics_port=args.gateway_metrics_port)
