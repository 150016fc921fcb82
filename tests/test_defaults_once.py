"""Each configuration knob's default is written once in ``src/`` (issue 37).

A knob is a field of a configuration class (``rlgate serve``'s dataclasses in ``config.py`` and
``engine/options.py``, the training run's sections in ``train/config.py``, the online mode's
``OnlineConfig`` in ``config.py``). Anywhere else in ``src/`` a parameter or field of the same name may take
that default by reference (``GatewayConfig.shutdown_timeout``, ``runner.EPISODE_TIMEOUT_S``) or set
its own, different value (a demo's settings, which may agree with another demo's); what fails is the
owner's literal written again, which drifts the day one copy is changed (``episode_timeout`` was 300
in seven places and 120 in the runner). Names that mean different things in different places (a random ``seed``, a ``host``) are
not knobs for this test; the list below says why each is left out. ``demo/`` and ``testing/`` are
not scanned: a demo's settings are values tuned and measured for that demo (docs/training.md), kept
even where they equal today's default, and the fakes' parameters shape a test's data.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import rlgate

SRC = Path(rlgate.__file__).parent
OWNERS = ("config.py", "engine/options.py", "engine/remote/options.py", "store/base.py", "train/config.py",
          "cli.py")
NOT_KNOBS = {
    "seed": "each task, agent and demo seeds its own randomness with 0",
    "host": "127.0.0.1 is the loopback every server binds by default (security.md); not one setting",
    "prefix": "a metric / path prefix of each writer",
    "mode": "different things: the rollout's mode, a trajectory's mode",
    "source": "different things: an agent's source, a feedback event's source",
    "what": "a message's wording",
    "engine": "different choices: serve's --engine (local, fake, sglang, vllm), a run's in-process one (local, scripted)",
    "dtype": "different things: the trained weights' dtype, the dtype a weight probe was computed in",
}


def _literal(node: ast.expr | None) -> object:
    """The literal a default is written as (None: not a literal, or None itself)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"Field", "option", "field"}:
        kw = {k.arg: k.value for k in node.keywords}
        return _literal(kw.get("default", node.args[0] if node.args else None))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value  # type: ignore[operator]
    if isinstance(node, ast.BinOp):  # 32 * 1024 * 1024
        try:
            return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})  # noqa: S307 - literals only
        except Exception:  # noqa: BLE001 - not a constant expression
            return None
    if isinstance(node, ast.Constant) and node.value is not None and not isinstance(node.value, bool):
        return node.value
    return None


def _defaults() -> dict[str, list[tuple[object, str]]]:
    found: dict[str, list[tuple[object, str]]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("demo/", "testing/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            pairs: list[tuple[str, ast.expr | None]] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                positional = a.posonlyargs + a.args
                pairs += [(p.arg, d) for p, d in zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True)]
                pairs += [(p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
            elif isinstance(node, ast.ClassDef):
                pairs += [(s.target.id, s.value) for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            for name, default in pairs:
                value = _literal(default)
                if value is not None:
                    found[name].append((value, f"{rel}:{default.lineno if default is not None else 0}"))
    return found


def _knobs() -> set[str]:
    """The fields of the configuration classes (however their default is written)."""
    names: set[str] = set()
    for owner in OWNERS:
        tree = ast.parse((SRC / owner).read_text())
        names |= {s.target.id for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for s in c.body
                  if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return names - set(NOT_KNOBS)


def test_each_knob_default_is_written_once():
    found = _defaults()
    twice = []
    for name in sorted(_knobs() & set(found)):
        by_value: dict[object, list[str]] = defaultdict(list)
        for value, where in found[name]:
            by_value[value].append(where)
        twice += [f"{name} = {value!r}: {', '.join(places)}" for value, places in by_value.items()
                  if len(places) > 1 and any(where.split(":")[0] in OWNERS for where in places)]
    assert not twice, ("a default written more than once (take it from its owner by reference instead):\n"
                       + "\n".join(twice))


def test_the_scan_sees_defaults_of_every_form():
    """The checker itself: it reads function, dataclass, option() and pydantic Field defaults."""
    found = _defaults()
    assert any(where.startswith("config.py:") for _, where in found["sweep_interval"])  # option(60.0, ...)
    assert any(where.startswith("train/config.py:") for _, where in found["warmup_steps"])  # Field(default=0)
    assert ("warning", "server/runner.py") in {(v, w.split(":")[0]) for v, w in found["log_level"]}  # a keyword default
    assert not any(where.startswith("rollout/runner.py:") for _, where in found["concurrency"])  # by reference
    assert (32 * 1024 * 1024, "config.py") in {(v, w.split(":")[0]) for v, w in found["max_body_bytes"]}
    assert {"episode_timeout", "shutdown_timeout", "tool_prompt", "sweep_interval"} <= _knobs()
    assert not {"seed", "host"} & _knobs()
