"""Synthetic tasks generated in code (no downloads), with train / held-out splits.

``math``: "Which is larger, 47 or 52?" / "Which is smaller, 47 or 52?" — two-digit
numbers, the answer is one of them. A model that has learned to copy a number from the
question but not yet to compare gets ~50%; the rule generalises to unseen pairs, so a
held-out split measures learning rather than memorisation.

``tools``: "What is 37 + 48?" with a ``calculator`` tool. The model should call the tool
with the expression, read the result and answer with it (a multi-turn conversation:
assistant tool call -> tool result -> assistant answer).

``sum``: "What is 37 + 48? Answer with the number only." with partial credit for a close answer.

``multiply``: "What is 347 * 582?" — three-digit products, which a 135M-parameter model cannot
work out in its head: the task of the tools demo on SmolLM2 (``demo/real_tools.py``), where only an
answer obtained through the calculator counts.

Every item is a dict the example agents understand: ``{"question", "answer"}``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass
class TaskSplit:
    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]


def math_item(a: int, b: int, larger: bool) -> dict[str, Any]:
    word = "larger" if larger else "smaller"
    return {"question": f"Which is {word}, {a} or {b}?", "answer": str(max(a, b) if larger else min(a, b))}


def math_task(seed: int = 0, n_heldout: int = 200, kinds: tuple[str, ...] = ("larger", "smaller")) -> TaskSplit:
    """``kinds``: which questions ("larger", "smaller"); the order of the two numbers is random either way."""
    rng = random.Random(seed)
    items = [math_item(a, b, kind == "larger") for a in range(10, 100) for b in range(10, 100) if a != b
             for kind in kinds]
    rng.shuffle(items)
    return TaskSplit(train=items[n_heldout:], heldout=items[:n_heldout])


def tools_item(a: int, b: int, op: str) -> dict[str, Any]:
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return {"question": f"What is {a} {op} {b}?", "answer": str(value), "expression": f"{a} {op} {b}"}


def tools_task(seed: int = 0, n_heldout: int = 200) -> TaskSplit:
    rng = random.Random(seed)
    items = [tools_item(a, b, op) for a in range(10, 100) for b in range(10, 100) for op in ("+", "-")]
    rng.shuffle(items)
    return TaskSplit(train=items[n_heldout:], heldout=items[:n_heldout])


def multiply_task(seed: int = 0, n_train: int = 2000, n_heldout: int = 200) -> TaskSplit:
    """Distinct ordered three-digit pairs ``a * b``; a held-out pair never appears in train."""
    rng = random.Random(seed)
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < n_train + n_heldout:
        pairs[(rng.randint(100, 999), rng.randint(100, 999))] = None
    items = [tools_item(a, b, "*") for a, b in pairs]
    return TaskSplit(train=items[n_heldout:], heldout=items[:n_heldout])


def sum_task(seed: int = 0, n_heldout: int = 200) -> TaskSplit:
    """``What is 37 + 48? Answer with the number only.``, two-digit operands, partial credit for a close
    answer (``format: closeness``: :func:`~rlgate.demo.math_agent.closeness_reward`, on the reply's last
    number): a task of another kind than ``math`` (an answer to work out, a reward that is not 0/1)."""
    rng = random.Random(seed)
    items = [{**tools_item(a, b, "+"), "question": f"What is {a} + {b}? Answer with the number only.",
              "format": "closeness"} for a in range(10, 100) for b in range(10, 100)]
    rng.shuffle(items)
    return TaskSplit(train=items[n_heldout:], heldout=items[:n_heldout])


TASKS = {"math": math_task, "tools": tools_task}
