"""ChatRenderer's prompt cache: identical template inputs render once (a GRPO group's roots, an
agent's retries), large prompts included, within a bound on the ids it holds."""

from __future__ import annotations

from rlgate.chat import render
from rlgate.chat.conversation import Message, ToolSpec
from rlgate.chat.render import ChatRenderer


def _tools(n: int, words: int) -> list[ToolSpec]:
    return [ToolSpec(name=f"tool{k}", description="does a thing " * words,
                     parameters={"type": "object", "properties": {"p": {"type": "string"}}}) for k in range(n)]


def test_a_large_prompt_renders_once_and_the_cache_stays_within_its_budget(tokenizer, monkeypatch):
    r = ChatRenderer(tokenizer)
    renders: list[int] = []
    real = r.render_text

    def counting(*args, **kwargs):
        renders.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(r, "render_text", counting)
    msgs = [Message.of("system", "You are an agent."), Message.of("user", "Fix the bug.")]
    tools = _tools(20, 60)  # a tool-using agent's first turn: thousands of tokens
    first = r.render_ids(msgs, tools)
    assert len(first) > 2048  # more than the old limit of cached prompts (1,024 tokens)
    assert [r.render_ids(msgs, tools) for _ in range(7)] == [first] * 7  # the rest of a group of 8
    assert len(renders) == 1
    assert r.render_ids(msgs, _tools(20, 61)) != first and len(renders) == 2  # other inputs: rendered

    monkeypatch.setattr(render, "PROMPT_CACHE_BUDGET_TOKENS", 3 * len(first))
    for k in range(6):
        r.render_ids([*msgs, Message.of("user", f"variant {k}")], tools)
        assert r._prompt_tokens <= 3 * len(first) + 64
        assert r._prompt_tokens == sum(len(ids) for ids, _ in r._prompts.values())
    assert len(r._prompts) <= 3
