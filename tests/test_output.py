"""The output assembler: token ids -> client text, identical however tokens arrive."""

from __future__ import annotations

from rlgate.chat.output import ContentDelta, OutputAssembler, ReasoningDelta, ToolCallDelta
from rlgate.chat.parsers import get_reasoning_parser, get_tool_parser


def assemble(tokenizer, ids, **kw):
    a = OutputAssembler(tokenizer, **kw)
    events = []
    for t in ids:
        events += a.push(t)
        if a.stopped:
            break
    events += a.finish()
    return a, events


def test_multibyte_characters_are_never_split(tokenizer):
    text = "héllo wörld — ✓ 你好"
    ids = tokenizer.encode(text, add_special_tokens=False)
    a, events = assemble(tokenizer, ids)
    assert a.result.content == text
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == text
    assert all("\ufffd" not in e.text for e in events)


def test_stop_token_hidden_but_counted(tokenizer, stop_ids):
    ids = tokenizer.encode("done", add_special_tokens=False) + [stop_ids[0]]
    a, _ = assemble(tokenizer, ids, stop_token_ids=stop_ids)
    assert a.result.content == "done" and a.kept_tokens == len(ids)


def test_stop_string_truncates_text_and_tokens(tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta", add_special_tokens=False)
    a, events = assemble(tokenizer, ids, stop_strings=["gamma", "zzz"])
    assert a.result.content == "alpha beta" and a.result.stop_sequence == "gamma"
    kept = tokenizer.decode(ids[: a.kept_tokens])
    assert kept.endswith("gamma") and "delta" not in kept
    assert "".join(e.text for e in events) == "alpha beta"


def test_stop_string_spanning_tokens_never_leaks(tokenizer):
    ids = tokenizer.encode("one two END three", add_special_tokens=False)
    _, events = assemble(tokenizer, ids, stop_strings=["END"])
    streamed = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert streamed == "one two" and "E" not in streamed


def test_tool_markup_never_streams_and_matches_non_streaming(tokenizer, stop_ids):
    text = 'Calling.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False) + [stop_ids[0]]
    a, events = assemble(tokenizer, ids, stop_token_ids=stop_ids, tool_parser=get_tool_parser("hermes"),
                         call_id=lambda: "call_1")
    streamed = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert streamed == a.result.content == "Calling."
    (tc,) = [e for e in events if isinstance(e, ToolCallDelta)]
    assert (tc.index, tc.id, tc.name, tc.arguments) == (0, "call_1", "add", '{"a": 1}')
    assert "<tool_call>" not in streamed


def test_reasoning_split_and_trim(tokenizer):
    text = "<think>\nfirst add\n</think>\n\nThe answer is 4."
    ids = tokenizer.encode(text, add_special_tokens=False)
    a, events = assemble(tokenizer, ids, reasoning_parser=get_reasoning_parser("think"),
                         tool_parser=get_tool_parser("hermes"))
    assert a.result.reasoning == "first add" and a.result.content == "The answer is 4."
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "first add"


def test_tool_call_inside_reasoning_is_not_parsed(tokenizer):
    text = '<think><tool_call>{"name": "f", "arguments": {}}</tool_call></think>ok'
    ids = tokenizer.encode(text, add_special_tokens=False)
    a, _ = assemble(tokenizer, ids, reasoning_parser=get_reasoning_parser("think"),
                    tool_parser=get_tool_parser("hermes"))
    assert a.result.tool_calls == [] and a.result.content == "ok"


def test_adjacent_text_deltas_join_in_order():
    from rlgate.chat.output import join_text_deltas

    call = ToolCallDelta(index=0, id="c", name="f", arguments="{}")
    events = [ReasoningDelta("a"), ReasoningDelta("b"), ContentDelta("x"), ContentDelta("y"), call,
              ContentDelta("z"), ReasoningDelta("r"), ContentDelta("w")]
    assert join_text_deltas(events) == [ReasoningDelta("ab"), ContentDelta("xy"), call, ContentDelta("z"),
                                        ReasoningDelta("r"), ContentDelta("w")]
    assert join_text_deltas([]) == []


def test_tokens_pushed_together_assemble_the_same_reply(tokenizer, stop_ids):
    """push_many (a delta of several tokens, or a whole non-streamed reply) == push one by one."""
    import json

    text = ("<think>first I add</think> The sum is <tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 1}})
            + "\n</tool_call> héllo ✓ wörld, then more")
    ids = tokenizer.encode(text, add_special_tokens=False) + [stop_ids[0]]
    for kw in ({}, {"stop_strings": ["then"]}, {"stop_strings": ["nowhere"]}):
        def make(kw=kw):
            return OutputAssembler(tokenizer, stop_token_ids=stop_ids, tool_parser=get_tool_parser("hermes"),
                                   reasoning_parser=get_reasoning_parser("think"), call_id=lambda: "call_1", **kw)

        one, _ = assemble(tokenizer, ids, stop_token_ids=stop_ids, tool_parser=get_tool_parser("hermes"),
                          reasoning_parser=get_reasoning_parser("think"), call_id=lambda: "call_1", **kw)
        for chunk in (1, 3, len(ids)):
            many = make()
            events = []
            for i in range(0, len(ids), chunk):
                events += many.push_many(ids[i:i + chunk])
                if many.stopped:
                    break
            events += many.finish()
            assert many.result == one.result and many.kept_tokens == one.kept_tokens, (kw, chunk)
            assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == one.result.content
        whole = make()  # a reply sent in one piece: decoded in one call
        events = whole.push_all(ids) + whole.finish()
        assert whole.result == one.result and whole.kept_tokens == one.kept_tokens, kw
        assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == one.result.content


def test_a_whole_reply_decoded_at_once_equals_token_by_token(tokenizer, stop_ids):
    """push_all's one decode == push's steps, random ids included (partial characters at the end)."""
    import random

    rng = random.Random(3)
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]
        one, _ = assemble(tokenizer, ids, stop_token_ids=stop_ids, reasoning_parser=get_reasoning_parser("think"))
        whole = OutputAssembler(tokenizer, stop_token_ids=stop_ids, reasoning_parser=get_reasoning_parser("think"))
        whole.push_all(ids)
        whole.finish()
        assert whole.result == one.result and whole.kept_tokens == one.kept_tokens, ids
