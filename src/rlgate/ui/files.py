"""Reading exported samples from files: Parquet, JSONL, or a directory of them (per-step dumps)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SUFFIXES = (".parquet", ".jsonl", ".json")


def sample_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files to read: each path, or the Parquet / JSONL files of a directory in name order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.suffix in SUFFIXES and q.is_file())
            if not found:
                raise FileNotFoundError(f"{p}: no .parquet or .jsonl files inside")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
            return data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            pass  # JSON lines after all
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_samples(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in sample_files(paths):
        rows += read_rows(p)
    return rows


def find_tokenizer(paths: Iterable[str | Path]) -> Path | None:
    """A tokenizer next to the data, if one is there: DIR/model or DIR/final (``rlgate demo`` output),
    or the ``model:`` of a training run's config.yaml."""
    for p in map(Path, paths):
        base = p if p.is_dir() else p.parent
        for d in (base, base.parent):
            for cand in (d / "model", d / "final"):
                if (cand / "tokenizer.json").is_file():
                    return cand
            cfg = d / "config.yaml"
            if cfg.is_file():
                import yaml

                model = (yaml.safe_load(cfg.read_text()) or {}).get("model")
                if isinstance(model, str) and (Path(model) / "tokenizer.json").is_file():
                    return Path(model)
    return None
