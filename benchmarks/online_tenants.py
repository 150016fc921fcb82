"""Two online tenants with opposite preferences, each training its own adapter policy on one gateway.

    python benchmarks/online_tenants.py --out /tmp/online-tenants                  # the tiny model, warm-started
    python benchmarks/online_tenants.py --out /tmp/online-tenants --seed 1 --learn-seconds 480 --window 300

One ``rlgate serve --online --online-train-adapters`` (the local engine) on the demo's warm-started tiny
model (``benchmarks/vs_trl.py``'s "toy" checkpoint). Two adapter policies are loaded untrained (B = 0:
each answers as the base does) and each bound to a tenant (``POST /v1/tenants/policy``). Both tenants'
users ask the same questions, "Which is larger, a or b?" (pairs of the math task's training split), through
the OpenAI SDK, and each gives a thumbs on every reply:

* tenant ``agree``: up when the reply's last number is the larger one (what the question asks);
* tenant ``contrary``: up when it is the smaller one (the opposite preference).

So one policy cannot suit both: whatever raises one tenant's approval lowers the other's.

1. **before**: both canaries pinned (new conversations on stable, version 0), ``window`` conversations per
   tenant; their feedback already trains each policy's learner.
2. **learning**: canaries unpinned; users go on for ``learn_seconds``. Each policy's canary serves its
   candidates to ``canary_share`` of its tenant's new conversations and promotes or rolls back on its own
   tenant's thumbs.
3. **after**: both canaries pinned again; ``window`` fresh conversations per tenant, all on each policy's
   stable version then.

Printed: each tenant's approval before and after (standard errors), each policy's canary decisions and
versions, the default policy's version (the frozen base: 0), the gateway's 5xx answers and failed
generations, and whether any of a tenant's turns was served by the other tenant's policy (from the
store's export: never).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402 - the warm-started tiny model
from two_policies import free_port, load, scrape_errors, serve  # noqa: E402

TENANTS = ("agree", "contrary")
_NUMBER = re.compile(r"-?\d+")


def approves(tenant: str, question: str, reply: str) -> bool:
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    found = _NUMBER.findall(reply)
    if not found:
        return False
    last = int(found[-1])
    return last == (max(a, b) if tenant == "agree" else min(a, b))


def fresh_adapter(model_dir: Path, out: Path, r: int) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.save_pretrained(out)
    return str(out.resolve())


class Users:
    """A tenant's users: conversations of one question each, a thumbs on every reply."""

    def __init__(self, url: str, tenant: str, key: str, questions: list[str], seed: int) -> None:
        from openai import AsyncOpenAI

        self.tenant = tenant
        self.auth = {"Authorization": f"Bearer {key}"}
        self.oai = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
        self.http = httpx.AsyncClient(base_url=url, timeout=120)
        self.questions = questions
        self.rng = random.Random(seed)
        self.n = 0
        self.errors = 0

    async def conversation(self) -> bool | None:
        self.n += 1
        question = self.rng.choice(self.questions)
        try:
            out = await self.oai.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": question}], max_tokens=8,
                temperature=1.0, extra_headers={"X-Conversation-Id": f"{self.tenant}-{self.n}-{secrets.token_hex(4)}"})
            reply = out.choices[0].message.content or ""
            up = approves(self.tenant, question, reply)
            r = await self.http.post("/v1/feedback", json={"kind": "thumbs", "value": up, "interaction_id": out.id},
                                     headers=self.auth)
            r.raise_for_status()
            return up
        except Exception as exc:  # noqa: BLE001 - counted and printed: the gateway must give none
            self.errors += 1
            print(f"{self.tenant}: {type(exc).__name__}: {exc}", flush=True)
            return None

    async def window(self, n: int, concurrency: int) -> list[bool]:
        out: list[bool] = []
        left = iter(range(n))

        async def worker() -> None:
            for _ in left:
                v = await self.conversation()
                if v is not None:
                    out.append(v)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return out

    async def until(self, deadline: float, concurrency: int) -> int:
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await self.conversation()
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done

    async def aclose(self) -> None:
        await self.oai.close()
        await self.http.aclose()


def rate(xs: list[bool]) -> tuple[float, float]:
    n = len(xs)
    p = sum(xs) / n if n else float("nan")
    return p, (p * (1 - p) / n) ** 0.5 if n else float("nan")


async def run(url: str, key: str, tenants: dict[str, str], questions: list[str], args: argparse.Namespace,
              out: Path) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {key}"}
    users = {t: Users(url, t, tenants[t], questions, seed=10 * args.seed + k) for k, t in enumerate(TENANTS)}
    async with httpx.AsyncClient(base_url=url, headers=admin, timeout=60) as c:
        async def pin(on: bool) -> None:
            for t in TENANTS:
                r = await c.post("/rl/canary/pin" if on else "/rl/canary/unpin", json={"policy": t, "reason": "benchmark"})
                r.raise_for_status()

        async def windows() -> dict[str, list[bool]]:
            got = await asyncio.gather(*(users[t].window(args.window, args.concurrency) for t in TENANTS))
            return dict(zip(TENANTS, got, strict=True))

        await pin(True)
        before = await windows()
        print("before: " + ", ".join(f"{t} {rate(v)[0]:.1%}" for t, v in before.items()) + f"; {load()}", flush=True)
        await pin(False)
        t0 = time.monotonic()
        deadline = t0 + args.learn_seconds
        trace: list[dict[str, Any]] = []

        async def watch() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(30)
                state = (await c.get("/rl/online")).json()["policies"]
                row = {"t": round(time.monotonic() - t0), **{t: {
                    "stable": s["canary"]["stable_version"], "canary": s["canary"]["canary_version"],
                    "steps": s["trainer"]["steps"],
                    "grad_norm": round(s["trainer"]["last_step"].get("grad_norm", float("nan")), 4),
                    "rewards": {v: round(r["mean"], 3) for v, r in
                                                                s["canary"]["rewards"].items()},
                    "lower": round(s["canary"]["comparison"]["lower"], 3) if s["canary"]["comparison"] else None,
                    "firing": [f"{g['guard']}@{g['version']}" for g in s["guards"]["firing"]]}
                    for t, s in state.items()}}
                trace.append(row)
                print(json.dumps(row), f"; {load()}", flush=True)

        conversations = await asyncio.gather(watch(), *(users[t].until(deadline, args.concurrency) for t in TENANTS))
        learn_s = time.monotonic() - t0
        await pin(True)
        after = await windows()
        print("after: " + ", ".join(f"{t} {rate(v)[0]:.1%}" for t, v in after.items()) + f"; {load()}", flush=True)
        state = (await c.get("/rl/online")).json()["policies"]
        policies = (await c.get("/rl/policies")).json()
    for u in users.values():
        await u.aclose()
    decisions = {t: [{k: d[k] for k in ("action", "version", "by")} for d in state[t]["canary"]["decisions"]]
                 for t in TENANTS}
    return {"before": before, "after": after, "learn_s": learn_s, "learn_conversations": conversations[1:],
            "trace": trace, "decisions": decisions, "policies": policies,
            "trainer": {t: {k: state[t]["trainer"][k] for k in ("steps", "trained_samples", "received_feedback_samples",
                                                              "published", "version")} for t in TENANTS},
            "client_errors": {t: users[t].errors for t in TENANTS}}


def served_by(store: Path, tenant_ids: dict[str, str]) -> dict[str, dict[str, int]]:
    """Which policy served each tenant's turns, from the store (the gateway stopped)."""
    from rlgate.online.conversations import tenant_of
    from rlgate.store.sqlite import SQLiteStore

    s = SQLiteStore(store)
    try:
        counts: dict[str, dict[str, int]] = {t: {} for t in tenant_ids}
        by_id = {v: k for k, v in tenant_ids.items()}
        for session in s.load():
            tenant = by_id.get(str(tenant_of(session)))
            if tenant is None:
                continue
            for inter in session.interactions.values():
                counts[tenant][str(inter.policy)] = counts[tenant].get(str(inter.policy), 0) + 1
        return counts
    finally:
        s.close()


def main(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model_dir, train, _ = vs_trl.prepare(out, "toy")
    questions = [it["question"] for it in train if it["question"].startswith("Which is larger,")]
    adapters = {t: fresh_adapter(model_dir, out / "adapters" / t, args.rank) for t in TENANTS}
    (out / "online-train.yaml").write_text(yaml.safe_dump({"grpo": {"lr": args.lr}}))
    key = secrets.token_urlsafe(32)
    env = {**os.environ, "RLGATE_ADMIN_KEY": key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = out / "store.db"
    store.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model_dir), "--engine", "local",
           "--port", str(port), "--store", str(store), "--log-level", "warning", "--online", "--online-train-adapters",
           "--online-train-config", str(out / "online-train.yaml"), "--train-batch", str(args.train_batch),
           "--canary-share", "0.5", "--canary-margin", str(args.margin), "--canary-min-samples", "30",
           "--conversation-idle-s", "2", "--hacking-reference-replies", "100"]
    print(" ".join(cmd[2:]), f"; {load()}", flush=True)
    server = serve(cmd, env, url, out / "serve.log")
    try:
        admin = {"Authorization": f"Bearer {key}"}
        tenant_keys, tenant_ids = {}, {}
        for t in TENANTS:
            r = httpx.post(url + "/rl/policies", json={"name": t, "path": adapters[t]}, headers=admin, timeout=120)
            r.raise_for_status()
            r = httpx.post(url + "/v1/tenants", json={"name": t}, headers=admin, timeout=60)
            r.raise_for_status()
            tenant_ids[t], tenant_keys[t] = r.json()["id"], r.json()["api_key"]
            r = httpx.post(url + "/v1/tenants/policy", json={"tenant_id": tenant_ids[t], "policy": t}, headers=admin,
                           timeout=60)
            r.raise_for_status()
        result = asyncio.run(run(url, key, tenant_keys, questions, args, out))
        result["errors"] = scrape_errors(url, key)
    finally:
        server.terminate()
        server.wait(120)
    result["served_by"] = served_by(store, tenant_ids)
    result["args"] = vars(args)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    n = args.window
    print(f"\napproval (thumbs up), {n} fresh conversations per tenant and window, standard errors in brackets:")
    print("| tenant (its policy) | wants | before (version 0) | after (stable) | stable version | canary decisions |")
    print("|---|---|---|---|---|---|")
    versions = {p["name"]: p["version"] for p in result["policies"]["policies"]}
    for t in TENANTS:
        (b, be), (a, ae) = rate(result["before"][t]), rate(result["after"][t])
        kinds: dict[str, int] = {}
        for d in result["decisions"][t]:
            kinds[d["action"]] = kinds.get(d["action"], 0) + 1
        print(f"| {t} | {'the larger number' if t == 'agree' else 'the smaller number'} | {b:.1%} (±{be:.1%}) | "
              f"**{a:.1%}** (±{ae:.1%}) | {versions[t]} | {', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))} |")
    print(f"default policy (the frozen base) at version {versions[result['policies']['default']]}; learning "
          f"{result['learn_s']:.0f} s, {result['learn_conversations']} conversations; trainers {result['trainer']}")
    print(f"served by: {result['served_by']}; gateway: {int(result['errors']['http_5xx'])} 5xx answers, "
          f"{int(result['errors']['generation_errors'])} failed generations; client errors "
          f"{result['client_errors']}; {load()}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--learn-seconds", type=float, default=240.0)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the users' questions")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--margin", type=float, default=0.2)
    sys.exit(main(parser.parse_args()))
