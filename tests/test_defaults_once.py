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
import typing
from collections import defaultdict
from pathlib import Path

import pytest

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


def _sections(model: type, seen: set[type]) -> list[type]:
    """``model`` and every pydantic section nested in it."""
    from pydantic import BaseModel

    if model in seen:
        return []
    seen.add(model)
    found = [model]
    for f in model.model_fields.values():
        for tp in (f.annotation, *typing.get_args(f.annotation)):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                found += _sections(tp, seen)
    return found


def test_a_training_section_embeds_a_serving_option_with_its_type_bounds_and_help():
    """One configuration system: the training run's sections take rlgate serve's options as they are
    declared (config.embedded): default, bounds and help from the option; the section's annotation, written
    for type checkers, must be the option's own."""
    from rlgate.config import GatewayConfig
    from rlgate.train.config import OnlineTrainConfig, TrainConfig

    owners = {cls.__name__: cls for cls in _options_classes()}
    embeds = []
    for section in _sections(TrainConfig, set()) + _sections(OnlineTrainConfig, set()):
        for name, f in section.model_fields.items():
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            if "embeds" not in extra:
                continue
            owner_name, option_name = str(extra["embeds"]).split(".")
            option = owners[owner_name].__pydantic_fields__[option_name]
            assert f.annotation == option.annotation, (section.__name__, name)
            assert f.description == option.description and f.metadata == option.metadata, (section.__name__, name)
            embeds.append(f"{section.__name__}.{name}")
    assert {"GatewaySettings.tool_parser", "GatewaySettings.context_length", "GatewaySettings.device",
            "RaySettings.replicas", "RaySettings.replica_num_cpus"} <= set(embeds)
    # the serving option's bound holds in the YAML section too
    from rlgate.train.config import GatewaySettings

    assert GatewayConfig.__pydantic_fields__["context_length"].metadata
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        GatewaySettings(context_length=0)


def _options_classes() -> list[type]:
    from rlgate.config import ClusterConfig, GatewayConfig, OnlineConfig
    from rlgate.engine.options import EngineOptions
    from rlgate.engine.remote.options import RemoteOptions
    from rlgate.store.base import StoreOptions

    return [GatewayConfig, ClusterConfig, OnlineConfig, EngineOptions, RemoteOptions, StoreOptions]


def test_serving_options_are_validated_by_pydantic_at_construction():
    """The serve side's options classes are pydantic dataclasses: a wrong type or a value out of bounds is
    refused whichever way it comes (a flag, code), as the training run's YAML is."""
    from pydantic import ValidationError

    from rlgate.config import GatewayConfig
    from rlgate.engine.options import EngineOptions

    for cls in _options_classes():
        assert hasattr(cls, "__pydantic_fields__"), cls
    with pytest.raises(ValidationError, match="max_sessions"):
        GatewayConfig(admin_key="k", max_sessions="many")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="max_tokens_cap"):
        GatewayConfig(admin_key="k", max_tokens_cap=0)
    with pytest.raises(ValidationError, match="engine"):
        EngineOptions(engine="tensorrt")  # type: ignore[arg-type]
    assert GatewayConfig(admin_key="k", max_sessions=5).max_sessions == 5


def test_rlgate_serve_refuses_an_option_out_of_bounds_before_loading_anything(tmp_path):
    """The bound is the option's (pydantic), and the command line names the flag; the model directory is
    empty, so the refusal comes before any tokenizer or weights are read."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tmp_path), "--engine", "fake",
                           "--max-tokens-cap", "0", "--context-length", "-5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--max-tokens-cap: Input should be greater than or equal to 1" in proc.stderr
    assert "--context-length: Input should be greater than or equal to 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tmp_path), "--engine", "fake",
                           "--port", "70000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--port: Input should be less than or equal to 65535" in proc.stderr, proc.stderr


# numbers a serving option may take anywhere on the line, each with the reason
UNBOUNDED = {
    "outcome_low": "the operator's outcome scale (its order is checked: outcome_high > outcome_low)",
    "outcome_high": "the operator's outcome scale",
    "reward_low": "the live reward's scale (its order is checked: reward_high > reward_low)",
    "reward_high": "the live reward's scale",
    "canary_floor": "a quality floor on the operator's reward scale",
}


def test_every_numeric_serving_option_has_bounds():
    """Every number from outside is checked: each int / float option of rlgate serve carries a pydantic
    bound (ge, gt, le, lt), so a negative count, a NaN timeout or a ratio of 5 is refused at startup."""
    from annotated_types import Ge, Gt, Le, Lt

    missing = []
    for cls in _options_classes() + [__import__("rlgate.cli", fromlist=["ServeOptions"]).ServeOptions]:
        for name, f in cls.__pydantic_fields__.items():
            base = [a for a in (typing.get_args(f.annotation) or (f.annotation,)) if a is not type(None)]
            if base not in ([int], [float]) or name in UNBOUNDED:
                continue
            if not any(isinstance(m, Ge | Gt | Le | Lt) for m in f.metadata):
                missing.append(f"{cls.__name__}.{name}")
    assert not missing, f"numeric options without bounds: {missing}"
    from rlgate.config import GatewayConfig, OnlineConfig

    for bad in ({"guard_fork_ratio": 5.0}, {"header_timeout": float("nan")}, {"max_sessions": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GatewayConfig(admin_key="k", **bad)
    with pytest.raises(ValueError, match="lr"):
        OnlineConfig(lr=0.0)
