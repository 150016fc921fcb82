"""A tiny bug-fix task for CLI agents: a generated repo, scored by running its tests.

Each task is a one-file module with one wrong operator and a ``unittest`` file that fails
because of it. ``setup`` writes both into the episode's working directory; ``verify`` runs
the tests after the agent finished and returns 1.0 if they pass with the test file
untouched, else 0.0.

    python -m rlgate.agents.bugfix --out tasks.jsonl --n 16     # a dataset for `rlgate train`
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["make_tasks", "setup", "verify"]

# (function, correct body, buggy body, test assertions)
BUGS: list[tuple[str, str, str, list[str]]] = [
    ("add(a, b)", "a + b", "a - b", ["add(2, 3) == 5", "add(-1, 1) == 0"]),
    ("multiply(a, b)", "a * b", "a + b", ["multiply(3, 4) == 12", "multiply(0, 5) == 0"]),
    ("largest(xs)", "max(xs)", "min(xs)", ["largest([3, 9, 4]) == 9", "largest([-2, -7]) == -2"]),
    ("is_even(n)", "n % 2 == 0", "n % 2 == 1", ["is_even(4)", "not is_even(7)"]),
    ("average(xs)", "sum(xs) / len(xs)", "sum(xs) / (len(xs) + 1)", ["average([2, 4]) == 3", "average([5]) == 5"]),
    ("last(xs)", "xs[-1]", "xs[0]", ["last([1, 2, 3]) == 3", "last(['a']) == 'a'"]),
]


def make_tasks(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        fn, _, buggy, checks = BUGS[rng.randrange(len(BUGS))] if i >= len(BUGS) else BUGS[i]
        name = fn.split("(")[0]
        module = f"def {fn}:\n    return {buggy}\n"
        test = (f"import unittest\n\nfrom calc import {name}\n\n\nclass Test(unittest.TestCase):\n"
                f"    def test_{name}(self):\n" + "".join(f"        self.assertTrue({c})\n" for c in checks)
                + "\n\nif __name__ == '__main__':\n    unittest.main()\n")
        tasks.append({
            "prompt": "The tests in test_calc.py fail. Fix the bug in calc.py so that "
                      "`python -m unittest` passes. Do not change test_calc.py.",
            "files": {"calc.py": module, "test_calc.py": test},
            "task_id": f"bugfix-{name}-{i}",
        })
    return tasks


def setup(workdir: Path, data: dict[str, Any]) -> None:
    for rel, text in data["files"].items():
        path = workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def verify(workdir: Path, transcript: Any, data: dict[str, Any], timeout: float = 60.0) -> float:
    """1.0 if ``python -m unittest`` passes in ``workdir`` and the tests are unchanged."""
    test = workdir / "test_calc.py"
    if not test.is_file() or _digest(test.read_text()) != _digest(data["files"]["test_calc.py"]):
        return 0.0
    try:
        proc = subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=workdir, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 0.0
    return 1.0 if proc.returncode == 0 else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=len(BUGS))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with open(args.out, "w", encoding="utf-8") as f:
        for task in make_tasks(args.n, args.seed):
            f.write(json.dumps(task) + "\n")


if __name__ == "__main__":
    main()
