"""Token-exact multi-turn per model family: forks, turns under loss, rewards, logprob exactness.

For every family of ``rlgate.chat.families`` a tiny random checkpoint with the family's
vocabulary and chat template is built (``rlgate.testing.families``), then:

* **scripted conversation** (fake engine replaying what the family's model writes,
  ``rlgate.testing.family_scripts``): 2 user turns, 5 replies — reasoning + tool call, reasoning +
  answer, tool call, answer, reasoning + answer; the client drops ``reasoning_content`` when it
  echoes replies (as OpenAI clients do). Run once per trajectory mode; a final reward of 1 is set,
  the session exported in concat style with γ = 0.5.
  Columns: concat samples, forks, generated turns under loss (of 5), turns the final reward reaches.
* **logprobs** (local engine, 3 sampled turns of 8 tokens, token_exact): max |logprob − teacher
  forcing| over every generated token of the concat sample (one forward pass over it).

    python benchmarks/families.py [--families qwen3 llama3 ...] [--no-logprobs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ADMIN = "bench-admin-key"
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
KWARGS: dict[str, dict[str, Any]] = {"llama3": {"date_string": "26 Jul 2024"}}
TURNS = [
    ("think_call", {"reasoning": "I should add 1 and 2.", "args": {"a": 1, "b": 2}}),
    ("think_answer", {"reasoning": "The tool said 3.", "answer": "1 + 2 = 3."}),
    ("call", {"args": {"a": 3, "b": 4}, "index": 1}),
    ("answer", {"answer": "3 + 4 = 7."}),
    ("think_answer", {"reasoning": "Polite.", "answer": "You are welcome!"}),
]


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def _app(engine: Any, tok: Any, path: Path) -> Any:
    from rlgate.config import GatewayConfig
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    return create_app(GatewayConfig(admin_key=ADMIN), engine, MemoryStore(), tok, stop_token_ids=stop_token_ids(tok, path))


async def scripted(family: str, path: Path, tok: Any, mode: str) -> dict[str, Any]:
    from rlgate.engine.fake import FakeEngine
    from rlgate.testing.family_scripts import script_ids

    script = script_ids(tok, family, TURNS)
    app = _app(FakeEngine(tok, script=list(script)), tok, path)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        r = await c.post("/rl/start_session", json={"task_id": "bench", "mode": mode}, headers=_admin())
        sid, key = r.json()["session_id"], r.json()["api_key"]
        auth = {"Authorization": f"Bearer {key}"}
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You add numbers."},
                                          {"role": "user", "content": "Add 1 and 2."}]
        for turn in range(len(TURNS)):
            r = await c.post("/v1/chat/completions", headers=auth, json={
                "messages": messages, "tools": TOOLS, "chat_template_kwargs": KWARGS.get(family, {})})
            r.raise_for_status()
            msg = r.json()["choices"][0]["message"]
            messages.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls") and v is not None})
            for tc in msg.get("tool_calls") or []:
                a = json.loads(tc["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": str(a["a"] + a["b"])})
            if not msg.get("tool_calls") and turn < len(TURNS) - 1:
                messages.append({"role": "user", "content": "And 3 + 4?" if turn == 1 else "Thanks."})
        await c.post("/rl/set_reward", json={"reward": 1.0}, headers=auth)
        await c.post("/rl/end_session", headers=auth)
        r = await c.post("/export_trajectories", json={"session_id": sid, "style": "concat", "discount": 0.5},
                         headers=_admin())
    exp = r.json()
    samples, stats = exp["interactions"], exp["stats"]
    under_loss = sum(len(s["chain"]) for s in samples) - stats["unaligned_turns"]
    rewarded = sum(1 for s in samples for x in s["turn_rewards"] if x is not None)
    return {"samples": len(samples), "forks": stats["fork"], "under_loss": under_loss, "rewarded": rewarded,
            "turns": stats["completed"]}


async def logprob_diff(family: str, path: Path, tok: Any) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.engine.local import LocalEngine

    app = _app(LocalEngine(str(path), device="cpu", max_batch_size=2), tok, path)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=300) as c:
        r = await c.post("/rl/start_session", json={"task_id": "bench"}, headers=_admin())
        sid, key = r.json()["session_id"], r.json()["api_key"]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say something."}]
        for turn in range(3):
            r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
                "messages": messages, "max_tokens": 8, "seed": turn, "chat_template_kwargs": KWARGS.get(family, {})})
            r.raise_for_status()
            msg = r.json()["choices"][0]["message"]
            messages += [{k: v for k, v in msg.items() if k in ("role", "content") and v is not None},
                         {"role": "user", "content": f"More {turn}."}]
        await c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})
        r = await c.post("/export_trajectories", json={"session_id": sid, "style": "concat"}, headers=_admin())
    (sample,) = r.json()["interactions"]
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logp = model(torch.tensor([sample["input_ids"]])).logits.float().log_softmax(-1)[0]
    return max(abs(logp[i - 1, t].item() - lp) for i, (t, m, lp) in
               enumerate(zip(sample["input_ids"], sample["loss_mask"], sample["logprobs"], strict=True)) if m)


def render_cost(tok: Any, renderer: Any, kwargs: dict[str, Any] | None, turns: int = 20) -> dict[str, Any]:
    """Median µs: fresh rendering of a ``turns``-turn chat by the family renderer and by the Jinja
    template, and one bridge by each (the last turn's new user message); whether the renderings agree."""
    import statistics

    from rlgate.chat.conversation import Message
    from rlgate.chat.families.base import BridgeError, ParentTurn
    from rlgate.chat.render import ChatRenderer

    jinja = ChatRenderer(tok)
    msgs = [Message.of("system", "You are helpful.")]
    for k in range(turns):
        msgs += [Message.of("user", f"Question {k}: what is {k} + {k}?"), Message.of("assistant", f"It is {2 * k}.")]
    msgs.append(Message.of("user", "Thanks."))

    def timed(fn: Any, repeats: int = 20) -> float:
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return statistics.median(out) * 1e6

    parent_prompt = renderer.render_ids(msgs[:-2], None, kwargs)
    parent = ParentTurn(parent_prompt, tok.encode(msgs[-2].text, add_special_tokens=False), msgs[-2], None)
    try:  # GLM-4.5's template writes no separator after a reply: the generic Jinja bridge cannot find one
        jinja_bridge_us: float | None = timed(lambda: jinja.bridge_ids(
            parent=parent, leading_system=msgs[0], new_messages=msgs[-1:], template_kwargs=kwargs))
    except BridgeError:
        jinja_bridge_us = None
    return {
        "same": renderer.render_ids(msgs, None, kwargs) == jinja.render_ids(msgs, None, kwargs),
        "family_us": timed(lambda: renderer.render_ids(msgs, None, kwargs)),
        "jinja_us": timed(lambda: jinja.render_ids(msgs, None, kwargs)),
        "bridge_us": timed(lambda: renderer.bridge_ids(parent=parent, leading_system=msgs[0], new_messages=msgs[-1:],
                                                       template_kwargs=kwargs)),
        "jinja_bridge_us": jinja_bridge_us,
    }


async def main() -> None:
    from transformers import AutoTokenizer

    from rlgate.chat.families.registry import resolve_family
    from rlgate.testing.families import CHECKPOINTS, build_family_checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=list(CHECKPOINTS))
    ap.add_argument("--no-logprobs", action="store_true", help="skip the local-engine logprob check")
    args = ap.parse_args()
    rows = []
    costs = []
    bpe_cache: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            t0 = time.perf_counter()
            path = build_family_checkpoint(family, Path(tmp) / family, bpe_cache=bpe_cache)
            tok = AutoTokenizer.from_pretrained(path)
            fam = resolve_family(tok)
            exact = await scripted(family, path, tok, "token_exact")
            rer = await scripted(family, path, tok, "rerender")
            diff = None if args.no_logprobs else await logprob_diff(family, path, tok)
            renderer = fam.renderer(tok)
            rows.append((family, renderer.name, exact, rer, diff))
            costs.append((family, renderer.name, render_cost(tok, renderer, KWARGS.get(family))))
            print(f"# {family}: {time.perf_counter() - t0:.0f} s: {rows[-1][1:]} {costs[-1][2]}", flush=True)
    print("| family | renderer | token_exact: samples / forks / turns under loss / turns rewarded "
          "| rerender: samples / forks / turns under loss | max abs logprob diff |")
    print("|---|---|---|---|---|")
    for family, renderer, e, r, diff in rows:
        d = "—" if diff is None else f"{diff:.1e}"
        print(f"| {family} | {renderer} | {e['samples']} / {e['forks']} / {e['under_loss']} of {e['turns']} / "
              f"{e['rewarded']} of {e['turns']} | {r['samples']} / {r['forks']} / {r['under_loss']} of {r['turns']} "
              f"| {d} |")
    print()
    print("| family | renderer | fresh 20-turn rendering: family renderer / Jinja template (µs, median) "
          "| same tokens | bridge of one user turn: family / Jinja (µs) |")
    print("|---|---|---|---|---|")
    for family, renderer, cost in costs:
        jb = "n/a" if cost["jinja_bridge_us"] is None else f"{cost['jinja_bridge_us']:.0f}"
        print(f"| {family} | {renderer} | {cost['family_us']:.0f} / {cost['jinja_us']:.0f} | "
              f"{'yes' if cost['same'] else 'no'} | {cost['bridge_us']:.0f} / {jb} |")


if __name__ == "__main__":
    asyncio.run(main())
