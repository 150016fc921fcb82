"""History matchers (rlgate.trajectory.matchers): a re-serialised reply extends its parent, or the
turn forks with a precise reason (issue 26). The smolagents package itself: test_agent_frameworks.py."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread
from rlgate.trajectory.matchers import load_matchers

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
# What Claude Code 2.1 sends after compacting (its binary's text), with the summary it formats from the reply.
COMPACTED = ("This session is being continued from a previous conversation that ran out of context. The summary "
             "below covers the earlier portion of the conversation.\n{summary}\nContinue the conversation from "
             "where it left off without asking the user any further questions.")


async def _export(c, sid, key) -> dict:
    await c.post("/rl/end_session", headers=key_headers(key))
    r = await c.post("/export_trajectories", json={"session_id": sid, "style": "individual"}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


def _smolagents_echo(call: dict, args: dict | None = None) -> str:
    """The assistant text smolagents' memory writes for a tool-calling step."""
    fn = call["function"]
    listed = [{"id": call["id"], "type": "function",
               "function": {"name": fn["name"], "arguments": args if args is not None else json.loads(fn["arguments"])}}]
    return "Calling tools:\n" + str(listed)


@pytest.mark.parametrize("edit,reason", [
    (None, None),
    ("arguments", "smolagents_calls_differ"),
    ("history", "smolagents_history_differs"),
    ("off", "no_prefix_match"),
])
async def test_smolagents_form_extends_or_forks_with_a_precise_reason(make_app, asgi_client, tokenizer, edit, reason):
    engine = FakeEngine(tokenizer, script=[CALL, "It is 3."])
    overrides = {"history_matchers": ["none"]} if edit == "off" else {}
    async with asgi_client(make_app(engine, **overrides)) as c:
        sid, key = await start_session(c)
        messages = [{"role": "system", "content": "You add."}, {"role": "user", "content": "New task:\n1 + 2?"}]
        r = await c.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS}, headers=key_headers(key))
        (call,) = r.json()["choices"][0]["message"]["tool_calls"]
        history = [{"role": "system", "content": "You add, carefully."}] if edit == "history" else messages[:1]
        echoed = _smolagents_echo(call, {"a": 9, "b": 2} if edit == "arguments" else None)
        follow = [*history, messages[1], {"role": "assistant", "content": echoed},
                  {"role": "user", "content": "Observation:\n3"}]
        r = await c.post("/v1/chat/completions", json={"messages": follow, "tools": TOOLS}, headers=key_headers(key))
        assert r.status_code == 200, r.text
        exp = await _export(c, sid, key)
    first, second = exp["interactions"]
    if reason is None:
        assert (second["relation"], second["parent_id"], second["fork_reason"]) == ("extend", first["id"], None)
        generated = first["input_ids"]  # prompt + the model's call tokens, then the observation as a user turn
        assert second["input_ids"][: len(generated)] == generated
        assert "Observation:" in tokenizer.decode(second["input_ids"][len(generated):])
    else:
        assert (second["relation"], second["fork_reason"]) == ("fork", reason)


async def test_claude_code_compaction_forks_as_compacted_and_keeps_the_lineage(make_app, tokenizer):
    """Claude Code compacts: a request asks for a summary (it extends the chain), then the history is
    replaced by that summary. The next turn forks with reason ``compacted`` (its tokens cannot extend the
    earlier ones), its lineage parent is the turn that wrote the summary, the episode stays one
    conversation, and the forks guard does not count it as a failure."""
    summary_reply = "<analysis>Went over it.</analysis>\n<summary>The user asked to add 1 and 2; the tool said 3.</summary>"
    engine = FakeEngine(tokenizer, script=[CALL, "It is 3.", summary_reply, "Continuing: 3.", "Done."])
    app = make_app(engine, guard_min_events=1, guard_fork_ratio=0.0)
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
            sid, key = await start_session(admin)
            ant = anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
            tools = [{"name": "add", "input_schema": TOOLS[0]["function"]["parameters"]}]
            messages: list = [{"role": "user", "content": "Add 1 and 2."}]
            r1 = await ant.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
            use = next(b for b in r1.content if b.type == "tool_use")
            messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3"}]}]
            r2 = await ant.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
            messages += [{"role": "assistant", "content": r2.content[0].text},
                         {"role": "user", "content": "Your task is to create a detailed summary of the conversation."}]
            r3 = await ant.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
            summary = "Summary:\nThe user asked to add 1 and 2; the tool said 3."  # as Claude Code formats r3
            compacted = [{"role": "user", "content": COMPACTED.format(summary=summary)}]
            r4 = await ant.messages.create(model="m", max_tokens=64, messages=compacted, tools=tools)
            compacted += [{"role": "assistant", "content": r4.content[0].text}, {"role": "user", "content": "ok"}]
            r5 = await ant.messages.create(model="m", max_tokens=64, messages=compacted, tools=tools)
            await ant.close()
            health = (await admin.get("/health")).json()
            exp = await _export(admin, sid, key)
    assert r3.content[0].text == summary_reply
    by_id = {i["id"]: i for i in exp["interactions"]}
    relations = [(by_id[r.id]["relation"], by_id[r.id]["fork_reason"]) for r in (r1, r2, r3, r4, r5)]
    assert relations == [("root", None), ("extend", None), ("extend", None), ("fork", "compacted"), ("extend", None)]
    assert by_id[r4.id]["lineage_parent_id"] == r3.id
    assert exp["stats"]["conversations"] == 1 and len({i["conversation_id"] for i in exp["interactions"]}) == 1
    assert health["status"] == "ok", health  # a compaction is not a failure to match


def test_matchers_are_pluggable():
    assert [m.name for m in load_matchers(["smolagents", "claude_code_compaction"])] == [
        "smolagents", "claude_code_compaction"]
    assert load_matchers(["smolagents", "none"]) == []
    custom = load_matchers(["none", "rlgate.trajectory.matchers:SmolagentsMatcher"])
    assert [m.name for m in custom] == ["smolagents"]
    with pytest.raises(ValueError, match="unknown history matcher"):
        load_matchers(["nope"])
