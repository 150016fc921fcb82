"""The package layers: imports point downward only, and no module imports itself back.

Each top-level part of ``rlgate`` has a rank; a module may import its own part and any part
of a lower rank, never a part of the same or a higher rank; a part's modules all share its rank
(no module inside a part gets a rank of its own). Every import counts, including
imports inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency.
The order (bottom to top) is the one docs/architecture.md draws.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlgate

SRC = Path(rlgate.__file__).parent

RANKS: dict[str, float] = {
    "errors": 0,
    "config": 0,
    "json_text": 0,
    "secret_files": 0,
    "object_spec": 0,
    "supervised": 0,
    "checkpoints": 1,
    "surfaces": 1,
    "model": 1,
    "engine": 1,
    "chat": 2,
    "trajectory": 3,
    "store": 4,
    "metrics": 5,
    "core": 6,
    "records": 3.5,  # rlgate serve --online: the feedback and tenant records the store keeps
    "online": 6.5,
    "api": 7,
    "ui": 8,
    "server": 9,
    "client": 10,
    "testing": 10,
    "cluster": 11,
    "rollout": 12,
    "agents": 13,
    "rewards": 13,
    "train": 14,
    "demo": 15,
    "integrations": 15,  # adapters for other trainers (TRL, verl): on the rollout runner and weight sync
    "cli": 16,
    "cli_cluster": 15,
    "__init__": 16,
    "__main__": 16,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _imports(path: Path) -> set[str]:
    """rlgate modules imported anywhere in the file (absolute names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "rlgate")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "rlgate":
                continue
            out.add(mod)
            for a in node.names:  # `from rlgate.api import router` imports a module
                if (SRC.parent / (mod.replace(".", "/") + f"/{a.name}.py")).exists() or (
                    SRC.parent / (mod.replace(".", "/") + f"/{a.name}/__init__.py")
                ).exists():
                    out.add(f"{mod}.{a.name}")
    return out


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(SRC.rglob("*.py"))}


def test_every_part_has_a_rank():
    parts = {_part(m) for m in _graph()}
    assert parts <= set(RANKS), f"parts without a layer rank: {sorted(parts - set(RANKS))}"


def test_imports_point_downward():
    bad = []
    for mod, deps in _graph().items():
        mine = _part(mod)
        for dep in deps:
            theirs = _part(dep)
            if theirs != mine and RANKS[theirs] >= RANKS[mine]:
                bad.append(f"{mod} -> {dep} ({mine}:{RANKS[mine]} -> {theirs}:{RANKS[theirs]})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _graph()
    # a package's __init__ importing its submodules is not a cycle with them
    edges = {m: {d for d in deps if d in graph and d != m and not m.startswith(d + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


MAX_LINES = 600  # docs/architecture.md: a source file past this is split along a concept


def test_no_source_file_is_over_the_line_limit():
    long = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"source files over {MAX_LINES} lines (split them along a concept): {long}"
