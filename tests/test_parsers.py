"""Tool-call and reasoning parsers: results, failures, and independence from chunking."""

from __future__ import annotations

import json
import random

import pytest

from rlgate.chat.parsers import (
    ContentText,
    ParsedToolCall,
    ReasoningText,
    get_reasoning_parser,
    get_tool_parser,
    reasoning_parser_names,
    tool_parser_names,
)


def run(parser, text: str, splits: list[int] | None = None):
    pieces = [text] if splits is None else [text[a:b] for a, b in zip([0] + splits, splits + [len(text)], strict=False)]
    events = []
    for p in pieces:
        events += parser.feed(p)
    events += parser.finish()
    return merge(events)


def merge(events):
    """Merge adjacent text events of the same kind (chunking changes only their boundaries)."""
    out = []
    for e in events:
        if out and type(e) is type(out[-1]) and isinstance(e, (ContentText, ReasoningText)):
            out[-1] = type(e)(out[-1].text + e.text)
        elif not (isinstance(e, (ContentText, ReasoningText)) and not e.text):
            out.append(e)
    return out


def all_chunkings(text: str, n_random: int = 20):
    yield None
    yield list(range(1, len(text)))  # one character at a time
    rng = random.Random(0)
    for _ in range(n_random):
        k = rng.randint(1, max(1, len(text) // 3))
        yield sorted(rng.sample(range(1, len(text)), min(k, len(text) - 1)))


def test_registry():
    assert {"hermes", "qwen", "llama3_json"} <= set(tool_parser_names())
    assert "think" in reasoning_parser_names()
    with pytest.raises(ValueError, match="unknown tool parser"):
        get_tool_parser("nope")


HERMES_CASES = [
    ("plain text", "Hello world", [ContentText("Hello world")]),
    ("one call", 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
     [ContentText("Sure.\n"), ParsedToolCall("add", '{"a": 1}')]),
    ("two calls", '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", '
     '"arguments": "{\\"x\\": 2}"}</tool_call>',
     [ParsedToolCall("f", "{}"), ContentText("\n"), ParsedToolCall("g", '{"x": 2}')]),
    ("bad json", '<tool_call>{"name": "f", "arguments": {</tool_call> tail',
     [ContentText('<tool_call>{"name": "f", "arguments": {</tool_call> tail')]),
    ("no name", '<tool_call>{"arguments": {}}</tool_call>', [ContentText('<tool_call>{"arguments": {}}</tool_call>')]),
    ("unclosed", 'x <tool_call>{"name": "f", "arguments": {}}', [ContentText('x <tool_call>{"name": "f", "arguments": {}}')]),
    ("partial marker at end", "text <tool_ca", [ContentText("text <tool_ca")]),
    # SmolLM2's function-calling format: a JSON list of calls in one block
    ("list of calls", '<tool_call>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]</tool_call>',
     [ParsedToolCall("f", '{"a": 1}'), ParsedToolCall("g", "{}")]),
    ("empty list", "<tool_call>[]</tool_call>", [ContentText("<tool_call>[]</tool_call>")]),
    ("list with a non-call", '<tool_call>[{"name": "f", "arguments": {}}, 3]</tool_call>',
     [ContentText('<tool_call>[{"name": "f", "arguments": {}}, 3]</tool_call>')]),
]


@pytest.mark.parametrize("name,text,expected", HERMES_CASES, ids=[c[0] for c in HERMES_CASES])
def test_hermes(name, text, expected):
    for splits in all_chunkings(text):
        assert run(get_tool_parser("hermes"), text, splits) == expected, splits


LLAMA_CASES = [
    ("text", "The answer is 4.", [ContentText("The answer is 4.")]),
    ("call", '{"name": "add", "parameters": {"a": 1}}', [ParsedToolCall("add", '{"a": 1}')]),
    ("python tag, two calls", '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": 1}}',
     [ParsedToolCall("f", "{}"), ParsedToolCall("g", '{"y": 1}')]),
    ("broken json", '{"name": "f", "parameters": {', [ContentText('{"name": "f", "parameters": {')]),
    ("json but not a call", '{"x": 1}', [ContentText('{"x": 1}')]),
]


@pytest.mark.parametrize("name,text,expected", LLAMA_CASES, ids=[c[0] for c in LLAMA_CASES])
def test_llama3_json(name, text, expected):
    for splits in all_chunkings(text):
        assert run(get_tool_parser("llama3_json"), text, splits) == expected, splits


THINK_CASES = [
    ("no reasoning", "Just an answer", [ContentText("Just an answer")]),
    ("reasoning then answer", "<think>\nadd them\n</think>\n\nIt is 4.",
     [ReasoningText("\nadd them\n"), ContentText("\n\nIt is 4.")]),
    ("unclosed", "<think>still thinking", [ReasoningText("still thinking")]),
    ("think not at start", "Answer <think>x</think>", [ContentText("Answer <think>x</think>")]),
    ("leading blank", "  <think>r</think>a", [ReasoningText("r"), ContentText("a")]),
]


@pytest.mark.parametrize("name,text,expected", THINK_CASES, ids=[c[0] for c in THINK_CASES])
def test_think(name, text, expected):
    for splits in all_chunkings(text):
        assert run(get_reasoning_parser("think"), text, splits) == expected, splits


def test_arguments_are_normalised_json():
    (call,) = run(get_tool_parser("hermes"), '<tool_call>{"name":"f","arguments":{"k":[1,2],"s":"é"}}</tool_call>')
    assert json.loads(call.arguments) == {"k": [1, 2], "s": "é"}


SCHEMAS = {"lookup": {"type": "object", "properties": {
    "code": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": ["number", "null"]},
    "flag": {"type": "boolean"}, "tags": {"type": "array"}, "opt": {"type": ["string", "integer"]}}}}
XML_CALLS = {
    "qwen3_xml": "<tool_call>\n<function=lookup>\n" + "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in
        [("code", "123"), ("n", "7"), ("x", "null"), ("flag", "true"), ("tags", '["a", 1]'), ("opt", "5"),
         ("free", "2.5"), ("note", "not json")]) + "</function>\n</tool_call>",
    "glm45": "<tool_call>lookup\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in
        [("code", "123"), ("n", "7"), ("x", "null"), ("flag", "true"), ("tags", '["a", 1]'), ("opt", "5"),
         ("free", "2.5"), ("note", "not json")]) + "</tool_call>",
}


@pytest.mark.parametrize("name", sorted(XML_CALLS))
def test_xml_style_arguments_are_typed_by_the_tool_schema(name):
    """Bare-text values follow the parameter's schema: a string "123" stays a string; without a schema,
    JSON when the text is JSON."""
    text = "Let me look. " + XML_CALLS[name]
    for splits in all_chunkings(text, n_random=5):
        content, call = run(get_tool_parser(name, SCHEMAS), text, splits)
        assert content == ContentText("Let me look. ") and call.name == "lookup"
        assert json.loads(call.arguments) == {"code": "123", "n": 7, "x": None, "flag": True, "tags": ["a", 1],
                                              "opt": 5, "free": 2.5, "note": "not json"}
    (call,) = run(get_tool_parser(name), XML_CALLS[name])  # no schemas: JSON where the text is JSON
    assert json.loads(call.arguments)["code"] == 123
    (call,) = run(get_tool_parser(name, {"lookup": {"type": "object", "properties": {"n": {"type": "integer"}}}}),
                  XML_CALLS[name].replace(">7<", ">seven<").replace("\n7\n", "\nseven\n"))
    assert json.loads(call.arguments)["n"] == "seven"  # not an integer: what the model wrote


def test_a_json_answer_is_no_unparsed_tool_call_unless_the_parser_reads_it_so():
    """A structured output ({"name": ...}) looks like a Llama 3 call only to the Llama 3 parser; with
    another parser (or none) it is an answer, not markup left unparsed (it flagged exports and
    turned /health degraded)."""
    from rlgate.chat.parsers.base import unparsed_tool_blocks

    answer = '{"name": "Bob", "age": 3}'
    assert unparsed_tool_blocks(answer) == 0
    assert unparsed_tool_blocks(answer, "hermes") == 0
    assert unparsed_tool_blocks(answer, "llama3_json") == 1  # that model's format: a call it failed to parse
    assert unparsed_tool_blocks('<tool_call>{"name": "add"}</tool_call>') == 1  # markup of any parser counts
    assert unparsed_tool_blocks("<|python_tag|>x<|python_tag|>y") == 2
