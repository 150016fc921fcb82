"""Packaging: declared dependencies match the imports, extras split what needs torch, no strays."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import rlgate

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(rlgate.__file__).parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(*extras: str) -> set[str]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return {_dist_name(r) for r in reqs} - {"rlgate"}


def _third_party_imports(files: list[Path]) -> set[str]:
    stdlib = set(sys.stdlib_module_names) | {"_typeshed"}
    names: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in stdlib and n not in ("rlgate", "__future__")}


def _dists_of(modules: set[str]) -> dict[str, set[str]]:
    by_module = importlib.metadata.packages_distributions()
    return {m: {d.lower().replace("_", "-") for d in by_module.get(m, [])} for m in modules}


# Imported only when a user has installed them and asked for them (train/tracking.py: `tracking:`;
# integrations/verl_loop.py: verl's own workers import it; verl 0.9.1 pins transformers<5.11).
OPTIONAL_IMPORTS = {"wandb", "mlflow", "verl"}


def test_every_import_of_the_package_is_declared_and_every_declaration_used():
    runtime = _declared("local", "train", "sdk", "demo", "cluster", "trl")
    files = sorted(SRC.rglob("*.py"))
    testing = SRC / "testing"  # helpers for tests (tiny family checkpoints): the test extra may serve them
    imported = _dists_of(_third_party_imports([f for f in files if testing not in f.parents]) - OPTIONAL_IMPORTS)
    undeclared = {m: d for m, d in imported.items() if not d & runtime}
    assert not undeclared, f"imported but not declared: {undeclared}"
    for_tests = _dists_of(_third_party_imports([f for f in files if testing in f.parents]))
    undeclared = {m: d for m, d in for_tests.items() if not d & (runtime | _declared("test"))}
    assert not undeclared, f"imported by rlgate.testing but not declared: {undeclared}"
    used = set().union(*imported.values(), *for_tests.values())
    used_by_others = {"jinja2",  # renders chat templates inside transformers, which does not require it
                      "uvloop", "httptools",  # uvicorn's event loop and HTTP parser (gateway and router)
                      "gguf", "accelerate"}  # transformers loads GGUF files with them (rlgate/checkpoints)
    assert runtime - used - used_by_others == set(), "declared but never imported"


def test_the_gateway_needs_no_torch():
    """torch is in the ``local`` extra only; a gateway for SGLang / vLLM servers never imports it."""
    assert "torch" not in _declared()
    assert "torch" in _declared("local")


def test_a_gateway_driving_remote_engines_runs_without_torch(tiny_tokenizer_dir):
    code = f"""
import sys
sys.modules["torch"] = None  # as if torch were not installed: importing it raises ImportError
import argparse, json
from rlgate.cli import add_serve_args, build_app
import rlgate.engine
engines = {{}}
for kind in ("vllm", "sglang"):
    p = argparse.ArgumentParser(); add_serve_args(p)
    args = p.parse_args(["--model", {str(tiny_tokenizer_dir)!r}, "--engine", kind, "--backend-url",
                         "http://127.0.0.1:9", "--store", ":memory:"])
    engines[kind] = type(build_app(args, "k" * 40).state.gateway.engine).__name__
try:
    rlgate.engine.LocalEngine
    local = "imported"
except ImportError as exc:
    local = str(exc)
print(json.dumps({{"engines": engines, "local": local}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["engines"] == {"vllm": "VLLMEngine", "sglang": "SGLangEngine"}
    assert "pip install 'rlgate[local]'" in facts["local"]


def test_the_demo_imports_only_rlgate():
    """The demo's agents live in the package; nothing imports a second top-level package."""
    assert not (ROOT / "setup.py").exists()
    for f in SRC.rglob("*.py"):
        assert "rlgate_examples" not in f.read_text(), f


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_build_artefacts_are_tracked():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    strays = [f for f in tracked if f.endswith((".whl", ".egg-info", ".pyc", ".sqlite")) or "__pycache__" in f]
    assert strays == []


def test_the_readmes_extras_table_names_every_extra_a_user_installs():
    """Issue 40: the table omitted `trl` and `cluster` (the `test` extra is the suite's own)."""
    table = (ROOT / "README.md").read_text().split("| `pip install ...` (in the clone) |", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `'\.\[(\w+)\]'` \|", table, flags=re.M))
    assert listed == set(PYPROJECT["project"]["optional-dependencies"]) - {"test"}
