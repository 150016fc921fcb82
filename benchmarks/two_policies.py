"""Two experiments on one gateway at the same time, each learning its own task on its own LoRA adapter.

    python benchmarks/two_policies.py --out /tmp/two-policies            # the tiny model, warm-started
    python benchmarks/two_policies.py --out /tmp/two-policies --steps 60 --lr 2e-3

One ``rlgate serve`` (the local engine) on the demo's warm-started tiny model (``benchmarks/vs_trl.py``'s
"toy" checkpoint: supervised on the math task until 65% validation accuracy), and two ``rlgate train``
runs started together against it (``gateway.url``, ``gateway.policy``, ``train.lora``): run ``larger``
trains on "Which is larger, a or b?" items only, run ``smaller`` on "Which is smaller, a or b?" items
only, each with the demo's SDK agents (half Anthropic, half OpenAI SDK) and their reward (1 when the
reply's last number is the answer). Before: the base model on 100 held-out items of each task (greedy;
the policies start as the base: their adapters' B is 0). After: each policy, and the base, on both
held-out sets. Also printed: each run's failed episodes and versions, the gateway's error answers and
failed generations (all must be 0), the policies' versions on the gateway (the base must stay at 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402 - the warm-started tiny model

TASKS = ("larger", "smaller")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


async def accuracy(url: str, key: str, policy: str | None, items: list[dict[str, Any]]) -> float:
    """Greedy accuracy of ``policy`` (None: the default) on ``items``: the demo's agent, reward 1.0 counted."""
    from rlgate.client import GatewayClient
    from rlgate.demo.agents import EitherSDKMathAgent

    client = GatewayClient(url, key, policy=policy)
    agent = EitherSDKMathAgent(max_tokens=8)
    sem = asyncio.Semaphore(32)

    async def one(item: dict[str, Any]) -> float:
        async with sem:
            s = await client.start_session("eval")
            try:
                reward = await agent.run({**item, "temperature": 0.0}, base_url=client.base_url, api_key=s.api_key)
            finally:
                await s.finish()
            return 1.0 if reward == 1.0 else 0.0

    try:
        scores = await asyncio.gather(*(one(it) for it in items))
    finally:
        await client.aclose()
    return sum(scores) / len(scores)


def serve(cmd: list[str], env: dict[str, str], url: str, log: Path) -> subprocess.Popen[bytes]:
    """``rlgate serve`` started (output to ``log``) and answering ``/health``; SystemExit with its log if not."""
    server = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"the gateway did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)


def scrape_errors(url: str, key: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=60).text
    out = {"http_5xx": 0.0, "generation_errors": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "rlgate_requests_total" and s.labels.get("status", "").startswith("5"):
                out["http_5xx"] += s.value
            if s.name == "rlgate_generations_total" and s.labels.get("finish_reason") == "error":
                out["generation_errors"] += s.value
    return out


def main(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model_dir, train, heldout_all = vs_trl.prepare(out, "toy")
    from rlgate.demo.tasks import math_task

    heldout_all = math_task(seed=0).heldout  # 200 held-out items of both kinds, never trained on
    split = {t: [it for it in train if f"Which is {t}," in it["question"]] for t in TASKS}
    heldout = {t: [it for it in heldout_all if f"Which is {t}," in it["question"]][:args.eval_items] for t in TASKS}
    for t in TASKS:
        with (out / f"{t}.jsonl").open("w") as f:
            for it in split[t]:
                f.write(json.dumps(it) + "\n")
    key = secrets.token_urlsafe(32)
    env = {**os.environ, "RLGATE_ADMIN_KEY": key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"model {model_dir}; {len(split['larger'])} / {len(split['smaller'])} training items; {load()}", flush=True)
    server = serve([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model_dir), "--engine", "local",
                    "--port", str(port), "--store", ":memory:", "--log-level", "warning", "--max-policies", "2"],
                   env, url, out / "serve.log")
    try:
        t0 = time.monotonic()
        before = {t: asyncio.run(accuracy(url, key, None, heldout[t])) for t in TASKS}
        print(f"before (the base; the policies start as it): larger {before['larger']:.1%}, smaller "
              f"{before['smaller']:.1%}; {load()}", flush=True)
        runs = {}
        for t in TASKS:
            cfg = {"model": str(model_dir), "out_dir": str(out / f"run-{t}"), "dataset": str(out / f"{t}.jsonl"),
                   "agent": "rlgate.demo.agents:EitherSDKMathAgent", "agent_kwargs": {"max_tokens": 8},
                   "steps": args.steps, "checkpoint_every": args.steps, "resume": False,
                   "gateway": {"url": url, "policy": t},
                   "train": {"lora": {"r": 16, "alpha": 32}},
                   "grpo": {"lr": args.lr, "groups_per_step": 8, "micro_batch_size": 32},
                   "rollout": {"group_size": 8, "concurrency": 64},
                   "tracking": {"plot": False}}
            (out / f"{t}.yaml").write_text(yaml.safe_dump(cfg))
            runs[t] = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "train", "--config", str(out / f"{t}.yaml")],
                                       env=env, stdout=(out / f"train-{t}.log").open("w"), stderr=subprocess.STDOUT)
        codes = {t: p.wait() for t, p in runs.items()}
        train_s = time.monotonic() - t0
        print(f"both runs done in {train_s:.0f} s (exit codes {codes}); {load()}", flush=True)
        for t in TASKS:
            if codes[t] != 0:
                print((out / f"train-{t}.log").read_text()[-3000:])
                return 1
        policies = httpx.get(url + "/rl/policies", headers={"Authorization": f"Bearer {key}"}).json()
        # the base by its name: with several policies served, a session must be bound to one (else 404)
        after = {(p, t): asyncio.run(accuracy(url, key, p or policies["default"], heldout[t]))
                 for p in (*TASKS, None) for t in TASKS}
        errors = scrape_errors(url, key)
    finally:
        server.terminate()
        server.wait(60)
    rows = []
    for t in TASKS:
        steps = [json.loads(line) for line in (out / f"run-{t}" / "metrics.jsonl").read_text().splitlines()]
        failed = sum(int(s.get("failed_episodes", 0)) for s in steps)
        rows.append({"run": t, "steps": len(steps), "failed_episodes": failed,
                     "reward_first5": sum(s["reward"] for s in steps[:5]) / 5,
                     "reward_last5": sum(s["reward"] for s in steps[-5:]) / 5})
    versions = {p["name"]: p["version"] for p in policies["policies"]}
    n = args.eval_items
    print(f"\nheld-out greedy accuracy, {n} items per task (standard error ~{50 / n ** 0.5:.0f} points at 50%):")
    print("| policy | 'which is larger' before → after | 'which is smaller' before → after | version |")
    print("|---|---|---|---|")
    for p in TASKS:
        print(f"| {p} | {before['larger']:.0%} → {after[(p, 'larger')]:.0%} | {before['smaller']:.0%} → "
              f"{after[(p, 'smaller')]:.0%} | {versions[p]} |")
    print(f"| base (default) | {before['larger']:.0%} → {after[(None, 'larger')]:.0%} | {before['smaller']:.0%} → "
          f"{after[(None, 'smaller')]:.0%} | {versions[policies['default']]} |")
    for r in rows:
        print(f"run {r['run']}: {r['steps']} steps, failed episodes {r['failed_episodes']}, reward (mean of 64 "
              f"episodes) first 5 steps {r['reward_first5']:.2f}, last 5 {r['reward_last5']:.2f}")
    print(f"gateway: {int(errors['http_5xx'])} 5xx answers, {int(errors['generation_errors'])} failed generations; "
          f"training {train_s:.0f} s; {load()}")
    (out / "result.json").write_text(json.dumps({"before": before, "after": {f"{p}:{t}": v for (p, t), v in after.items()},
                                                 "versions": versions, "runs": rows, "errors": errors,
                                                 "train_s": train_s, "args": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-items", type=int, default=100)
    sys.exit(main(parser.parse_args()))
