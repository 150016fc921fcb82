"""Loading what a config names — the agent, the reward function, the model, the datasets —
with errors that name the culprit (and never a traceback from deep inside a library).

The agent and reward modules are imported from the current directory too (it is put at
the front of ``sys.path``, as ``python -m`` does), so ``agent: my_agent:MyAgent`` works
for a ``my_agent.py`` next to the config without setting PYTHONPATH. They are your code,
named in your config; nothing is ever imported because of an HTTP request.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

from rlgate.object_spec import ObjectSpecError, exception_text, load_object
from rlgate.rollout.agent import CONTRACT, validate_agent
from rlgate.rollout.errors import RunError
from rlgate.train.config import ConfigError, DatasetSource
from rlgate.trajectory.reward import GroupReward


class _FunctionAgent:
    """An ``async def run(data, *, base_url, api_key, ...)`` function used as an agent."""

    def __init__(self, fn: Any) -> None:
        self.run = fn
        self.__name__ = getattr(fn, "__name__", "agent")


def import_object(spec: str, key: str) -> Any:
    """``module:attr`` (``key`` names the config field in errors); the cwd is importable."""
    try:
        return load_object(spec, key, cwd_importable=True)
    except ObjectSpecError as exc:
        raise ConfigError(str(exc)) from None


def load_agent(spec: str, kwargs: dict[str, Any] | None = None) -> Any:
    """The agent named by ``spec``: a class (built with ``kwargs``), an object with ``run``, or a function."""
    obj = import_object(spec, "agent")
    if isinstance(obj, type):
        try:
            obj = obj(**(kwargs or {}))
        except TypeError as exc:
            raise ConfigError(f"agent_kwargs: {spec}(**{kwargs or {}}) failed: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's constructor raised
            raise ConfigError(f"agent: building {spec} failed: {exception_text(exc)}") from None
    elif kwargs:
        raise ConfigError(f"agent_kwargs: {spec} is not a class, so agent_kwargs cannot be applied")
    elif inspect.isfunction(obj) or inspect.ismethod(obj):
        obj = _FunctionAgent(obj)
    validate_agent(obj, name=f"agent {spec!r}")
    return obj


def load_reward_fn(spec: str, kwargs: dict[str, Any] | None = None) -> Any:
    """The reward named by ``spec`` (a class is built with ``kwargs``): a function ``fn(episode)``, or an object
    with ``score_group(episodes)``, or both (trajectory/reward.py)."""
    obj = import_object(spec, "reward")
    if isinstance(obj, type):
        try:
            obj = obj(**(kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - the user's constructor raised
            raise ConfigError(f"reward_kwargs: building {spec} failed: {exc}") from None
    elif kwargs:
        raise ConfigError(f"reward_kwargs: {spec} is not a class, so reward_kwargs cannot be applied")
    if isinstance(obj, GroupReward) and not callable(obj):
        return obj  # the group form only: GRPO groups are scored side by side, evaluation in groups of one
    if not callable(obj):
        raise ConfigError(f"reward: {spec} is a {type(obj).__name__}, not a function fn(episode) -> float "
                          "nor an object with score_group(episodes) -> list[float]")
    try:
        inspect.signature(obj).bind(object())
    except TypeError as exc:
        raise ConfigError(f"reward: {spec} cannot be called as fn(episode) ({exc})") from None
    except ValueError:
        pass
    return obj


# --------------------------------------------------------------------------- model


def resolve_model(model: str, key: str = "model") -> Path:
    """A local checkpoint directory for ``model``: the directory itself, a ``.gguf`` file or a
    name from ``rlgate models list`` (converted once, cached), or a Hugging Face hub id already
    in the local cache (nothing is downloaded)."""
    from rlgate.checkpoints import ModelNotFound
    from rlgate.checkpoints import resolve_model as resolve_checkpoint

    try:
        path = resolve_checkpoint(model)
    except (ModelNotFound, FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{key}: {path} is a directory but not a Hugging Face checkpoint (no config.json)")
        return path
    if path.exists():
        raise ConfigError(f"{key}: {path} is a file; expected a checkpoint directory (config.json, weights, "
                          "tokenizer)")
    looks_like_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    if looks_like_id:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(model, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache: say so below
            pass
    raise ConfigError(f"{key}: {model!r} does not exist (looked for a directory {path.resolve()}"
                      + (", and for a hub id in the local Hugging Face cache; rlgate downloads nothing" if looks_like_id
                         else "") + ")")


# --------------------------------------------------------------------------- datasets


def load_dataset(source: DatasetSource, key: str = "dataset") -> list[dict[str, Any]]:
    """Items (JSON objects) from JSONL / JSON, Parquet, or a ``datasets`` directory saved with
    ``save_to_disk``; errors name the file and line."""
    path = Path(source.path).expanduser()
    if not path.exists():
        raise ConfigError(f"{key}: {path} does not exist (relative paths are from {os.getcwd()})")
    if path.is_dir():
        items = _load_saved_dataset(path, source.split, key)
    elif path.suffix == ".parquet":
        items = _load_parquet(path, key)
    else:
        items = _load_jsonl(path, key)
    if source.limit is not None:
        items = items[: source.limit]
    if not items:
        raise ConfigError(f"{key}: {path} has no items")
    return items


def _load_jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: {path}: not valid JSON: {exc}") from None
        rows = list(enumerate(data, 1))
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: {path} line {n}: not valid JSON ({exc.msg}); expected one JSON object "
                                  "per line") from None
    for n, row in rows:
        if not isinstance(row, dict):
            raise ConfigError(f"{key}: {path} item {n} is a {type(row).__name__}; each item must be a JSON object")
    return [row for _, row in rows]


def _load_parquet(path: Path, key: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{key}: reading {path} needs pyarrow (pip install 'rlgate[train]')") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - a broken file: say which
        raise ConfigError(f"{key}: {path}: not a readable Parquet file ({exc})") from None


def _load_saved_dataset(path: Path, split: str | None, key: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{key}: reading {path} needs the datasets package (pip install 'rlgate[train]')") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - not a saved dataset
        raise ConfigError(f"{key}: {path} is a directory but not a dataset saved with save_to_disk ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        chosen = split or (names[0] if len(names) == 1 else "train")
        if chosen not in ds:
            raise ConfigError(f"{key}.split: {path} has splits {names}; set {key}.split to one of them")
        ds = ds[chosen]
    elif split is not None:
        raise ConfigError(f"{key}.split: {path} is a single dataset, not a DatasetDict; remove split")
    return [dict(row) for row in ds]


def describe_error(exc: BaseException) -> str:
    """One line for errors the CLI reports (RunError messages are already written for people)."""
    return str(exc) if isinstance(exc, RunError) else f"{type(exc).__name__}: {exc}"


__all__ = ["CONTRACT", "describe_error", "import_object", "load_agent", "load_dataset", "load_reward_fn",
           "resolve_model"]
