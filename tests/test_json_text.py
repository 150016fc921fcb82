"""rlgate.json_text: orjson where it can, the standard library where orjson refuses, same values."""

from __future__ import annotations

import json
import random

import pytest

from rlgate.json_text import dumps, dumps_text


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == 2:
        return rng.choice([0.0, -0.0, 1e-300, 1.5, -2.25e17, 0.1, 1 / 3])
    if kind == 3:
        alphabet = "aé€😀\n\t\"\\/\x00\x1f<>&\u2028"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}{rng.choice('é€')}": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def test_values_read_back_equal_to_the_standard_librarys():
    rng = random.Random(14)
    for _ in range(500):
        v = _random_value(rng)
        assert json.loads(dumps(v)) == json.loads(json.dumps(v)) == v
        assert json.loads(dumps_text(v, ascii_fallback=True)) == v


def test_what_orjson_refuses_takes_the_standard_library():
    big = {"n": 2**70, "neg": -(2**80)}  # beyond 64 bits
    assert json.loads(dumps(big)) == big
    assert json.loads(dumps({1: "a", None: "b"})) == {"1": "a", "null": "b"}  # non-string keys, as json does
    lone = {"content": "half a pair: \ud800"}
    # the store keeps it (ASCII-escaped), a response cannot send it (as before: it is not UTF-8)
    assert json.loads(dumps_text(lone, ascii_fallback=True)) == lone
    assert json.loads(dumps(lone, ascii_fallback=True)) == lone
    with pytest.raises(UnicodeEncodeError):
        dumps(lone)
    with pytest.raises(TypeError):
        dumps(object())  # neither encoder knows it
    assert dumps(object(), default=lambda o: "x") == b'"x"'


def test_output_is_compact_utf8():
    assert dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert dumps_text({"a": None}) == '{"a":null}'


def test_canonical_bytes_ignore_key_order_and_read_back():
    from rlgate.json_text import canonical

    rng = random.Random(15)
    for _ in range(300):
        v = _random_value(rng)
        assert json.loads(canonical(v)) == v
        if isinstance(v, dict):
            assert canonical(dict(reversed(list(v.items())))) == canonical(v)
    nested = {"b": {"y": 1, "x": [{"q": 1, "p": 2}]}, "a": 0}
    assert canonical(nested) == b'{"a":0,"b":{"x":[{"p":2,"q":1}],"y":1}}'
    lone = {"s": "\ud800", "n": 2**70}  # what orjson refuses: the standard library, bytes all the same
    assert json.loads(canonical(lone).decode("utf-8", "surrogatepass")) == lone
