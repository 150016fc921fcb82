"""What one rollout round of ``rlgate train`` costs, without the training step, A/B in one process.

    python benchmarks/rollout_cost.py --out /tmp/vs-trl --rounds 6
    py-spy record -o /tmp/rollout.svg --threads -- .venv/bin/python benchmarks/rollout_cost.py --out /tmp/vs-trl

The setup of ``benchmarks/vs_trl.py``'s ``rlgate`` side (the tiny model's demo warm start cached in
``--out``, the in-process gateway :func:`~rlgate.train.gateway.open_gateway` starts, the demo's
``EitherSDKMathAgent``, 8 prompts × 8 episodes of at most 8 new tokens, 64 in flight), minus the
trainer: each round grants 64 sessions and plays the 8 groups with the very
:class:`~rlgate.rollout.runner.RolloutRunner` ``rlgate train`` builds. ``--variants`` are played in
turn, round by round (so the machine's load falls on all alike): ``new`` (the runner's defaults) starts
the round's sessions in one ``POST /rl/start_sessions`` and ends, rewards and exports each episode with
one ``POST /rl/finish_session``: two control calls per episode, one of them shared; ``finish-only``
starts each session with its own call; ``old`` makes the four calls of before (start, end,
set_reward, export); ``no-dedup`` is ``new`` with the local engine prefilling every row of a group
(the same prompt 8 times) instead of once; ``torch-threads`` is ``new`` with the engine's forward passes
on all of torch's threads (as before ``open_gateway`` left one core to the Python threads). Prints per
variant the median round wall time, its CPU time (``time.process_time``, every thread of the process),
the per-episode cost and the ratio to the first variant, with the load average; each round's line
also gives the engine's forward passes (prefill passes and rows, decoding steps and rows).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import vs_trl  # noqa: E402 - the same prepared checkpoint and settings

# the engine's counters printed per round (forward passes and the rows they ran)
ENGINE_COUNTERS = ("prefill_passes", "prefill_rows", "decode_steps", "decode_rows")
# name -> (runner.batch_starts, runner.fused_finish, engine.dedup_prefill, engine threads: None = open_gateway's)
VARIANTS: dict[str, tuple[bool, bool, bool, int | None]] = {
    "new": (True, True, True, None), "no-dedup": (True, True, False, None),
    "torch-threads": (True, True, True, torch.get_num_threads()), "finish-only": (False, True, True, None),
    "old": (False, False, True, None)}


async def run(out: Path, rounds: int, variants: list[str]) -> None:
    from rlgate.train.config import TrainConfig
    from rlgate.train.gateway import GatewayPlan, engine_threads, open_gateway
    from rlgate.train.loading import load_agent
    from rlgate.train.run import make_runner

    model_dir, train, _ = vs_trl.prepare(out, "toy")
    s = vs_trl.settings("toy")
    n = s["groups"] * s["group_size"]
    cfg = TrainConfig.model_validate({
        "model": str(model_dir), "out_dir": str(out / "rollout-cost"), "dataset": "unused.jsonl",
        "agent": "rlgate.demo.agents:EitherSDKMathAgent",
        "agent_kwargs": {"model": "policy", "max_tokens": s["max_tokens"]},
        "rollout": {"group_size": s["group_size"], "concurrency": n, "seed": 0},
    })
    gw = await open_gateway(GatewayPlan.of(cfg), model_dir, model_dir)
    engine = gw.sync.engine
    default_threads = engine_threads(None) or torch.get_num_threads()
    runner = make_runner(cfg, gw.client, load_agent(cfg.agent, cfg.agent_kwargs), None)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    try:
        for r in range(rounds + 1):  # round 0 warms up (connections, caches) and is not counted
            for v in variants:
                runner.batch_starts, runner.fused_finish, engine.dedup_prefill, threads = VARIANTS[v]
                await engine.set_threads(threads or default_threads)
                items = [(f"r{r}{v}-{g}", train[(r * s["groups"] + g) % len(train)]) for g in range(s["groups"])]
                await gw.client.grant_capacity(n)
                before = engine.stats()
                t, c = time.perf_counter(), time.process_time()
                groups = [g async for g in runner.groups(items)]
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                passes = {k: engine.stats()[k] - before[k] for k in ENGINE_COUNTERS}
                failed = sum(not e.ok for g in groups for e in g.episodes)
                if failed:
                    raise SystemExit(f"{v}: {failed} of {n} episodes failed: {runner.counters.first_failure}")
                if r:
                    times[v].append((wall, cpu))
                print(f"round {r} {v}: {wall:.3f} s wall, {cpu:.3f} s CPU (load {os.getloadavg()[0]:.2f}); "
                      "engine: " + ", ".join(f"{k} {n}" for k, n in passes.items()), flush=True)
    finally:
        await runner.aclose()
        await gw.close()
    base = statistics.median(w for w, _ in times[variants[0]])
    print(f"\n{rounds} rounds of {n} episodes (median), load average now {os.getloadavg()}")
    for v in variants:
        wall = statistics.median(w for w, _ in times[v])
        cpu = statistics.median(c for _, c in times[v])
        print(f"{v:>9}: {wall:.3f} s/round wall ({1000 * wall / n:.1f} ms/episode), {cpu:.3f} s CPU; "
              f"{wall / base:.2f}x {variants[0]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="vs-trl-out", help="vs_trl.py's --out (the warm start is cached there)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(out, args.rounds, args.variants))


if __name__ == "__main__":
    main()
