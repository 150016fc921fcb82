"""Cost of preparing the prompt at turn 1, 10, 50 and 100 of a growing conversation.

rlgate ``token_exact``: find the parent interaction (rolling digest over the request's
messages) and render only the new messages (the bridge) after the parent's tokens.
Baseline (the original's approach): re-render the whole conversation with the chat
template and re-tokenize it, every turn.

Each turn appends a user message (~40 words) and an assistant reply (~60 words; every
third reply is a tool call followed by a tool result). Timings are medians over
repeats, measured in the same process, side by side.

    python benchmarks/multiturn_prompt_cost.py [--turns 1 10 50 100] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from rlgate.chat.conversation import Message, ToolCall, ToolSpec
from rlgate.config import GatewayConfig
from rlgate.core.generation import GenerationService
from rlgate.core.request import ChatRequest
from rlgate.core.sessions import SessionManager
from rlgate.engine.fake import FakeEngine
from rlgate.model import load_tokenizer, stop_token_ids
from rlgate.store.base import MemoryStore
from rlgate.trajectory.interaction import Session
from rlgate.trajectory.tree import interaction_key

WORDS = ("the model reads a question about numbers and tools then writes a careful answer with steps "
         "checking every value twice before it replies to the user in plain words").split()
TOOLS = [ToolSpec("add", "Add two integers", {"type": "object", "properties": {"a": {"type": "integer"},
                                                                              "b": {"type": "integer"}}})]


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def reply_for(turn: int, rng: random.Random) -> tuple[str, Message]:
    """(generated text, the assistant message the client echoes back)."""
    if turn % 3 == 2:
        args = {"a": rng.randint(0, 99), "b": rng.randint(0, 99)}
        text = f'<tool_call>\n{{"name": "add", "arguments": {json.dumps(args)}}}\n</tool_call>'
        return text, Message(role="assistant", tool_calls=[ToolCall(f"call_{turn}", "add", json.dumps(args))])
    text = sentence(rng, 60)
    return text, Message.of("assistant", text)


def build(service: GenerationService, session: Session, req: ChatRequest):
    """service.build_prompt, run to completion (inline: the rendering cost itself is measured)."""
    coro = service.build_prompt(session, req)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("build_prompt awaited the render pool; set service.inline_chars higher")


def build_conversation(service: GenerationService, tokenizer, stops, turns: int, rng: random.Random):
    """Run ``turns`` turns through the real prompt builder; return the session and the next request."""
    session = Session(id="bench-0", task_id="bench", key_hash="x")
    messages = [Message.of("system", "You are a careful assistant."), Message.of("user", sentence(rng, 40))]
    for turn in range(turns - 1):
        req = ChatRequest(messages=list(messages), tools=TOOLS)
        inter = build(service, session, req).interaction
        text, echoed = reply_for(turn, rng)
        inter.id = f"i{turn}"
        inter.output_ids = tokenizer.encode(text, add_special_tokens=False) + [stops[0]]
        inter.output_logprobs = [-1.0] * len(inter.output_ids)
        inter.output_versions = [0] * len(inter.output_ids)
        inter.finish_reason, inter.stop_kind = "stop", "stop_token"
        service.sessions.add_interaction(session, inter)
        inter.output_message = echoed
        inter.prefix_key = interaction_key(inter)
        service.sessions.complete_interaction(session, inter)
        messages.append(echoed)
        if echoed.tool_calls:
            messages.append(Message.of("tool", str(rng.randint(0, 200)), tool_call_id=echoed.tool_calls[0].id))
        messages.append(Message.of("user", sentence(rng, 40)))
    return session, ChatRequest(messages=list(messages), tools=TOOLS)


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, nargs="+", default=[1, 10, 50, 100])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model
    if model is None:
        from rlgate.demo.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    tokenizer = load_tokenizer(model)
    stops = stop_token_ids(tokenizer, model)
    config = GatewayConfig(admin_key="x" * 40)
    service = GenerationService(config=config, engine=FakeEngine(tokenizer, max_context_length=10**7),
                                tokenizer=tokenizer, sessions=SessionManager(config, MemoryStore()),
                                stop_token_ids=stops)
    service.inline_chars = 1 << 62  # measure rendering itself, not the hand-off to the render pool
    rows = []
    for turns in args.turns:
        session, req = build_conversation(service, tokenizer, stops, turns, random.Random(0))
        built = build(service, session, req)
        prompt, inter = built.prompt_ids, built.interaction
        assert turns == 1 or inter.relation == "extend"
        exact = median_time(lambda s=session, r=req: build(service, s, r), args.repeats)
        rerender = median_time(lambda r=req: service.renderer.render_ids(r.messages, r.tools), args.repeats)
        rows.append((turns, len(req.messages), len(prompt), exact, rerender))
    base = rows[0][3]
    print(f"{'turn':>5} {'msgs':>5} {'tokens':>7} {'token_exact ms':>15} {'re-render ms':>13} "
          f"{'vs turn 1':>10} {'re-render/exact':>16}")
    for turns, n_msgs, n_tok, exact, rerender in rows:
        print(f"{turns:>5} {n_msgs:>5} {n_tok:>7} {exact * 1e3:>15.3f} {rerender * 1e3:>13.3f} "
              f"{exact / base:>10.2f} {rerender / exact:>16.1f}")
    print(json.dumps([{"turn": t, "messages": m, "tokens": n, "token_exact_ms": round(e * 1e3, 4),
                       "rerender_ms": round(r * 1e3, 4)} for t, m, n, e, r in rows]))


if __name__ == "__main__":
    main()
