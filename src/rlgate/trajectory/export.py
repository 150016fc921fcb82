"""Turning a session's interactions into training samples, batches and files.

A sample is a :class:`~rlgate.trajectory.sample.Sample` (fields documented there and in
docs/trajectory-format.md): ``individual`` style gives one per completed LLM call,
``concat`` one per root-to-leaf chain with loss on every generated segment.
Tensors (:func:`to_padded_tensors`, :func:`to_packed_tensors`) and files
(:func:`write_jsonl`, :func:`write_parquet`) take samples or their dict (wire) form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlgate.chat.conversation import message_to_openai
from rlgate.trajectory.flags import reply_flags
from rlgate.trajectory.interaction import Interaction
from rlgate.trajectory.sample import Sample
from rlgate.trajectory.tree import chain_of, children_map, conversation_ids, discounted_rewards, lineage_parents

__all__ = ["Lineage", "concat_sample", "export_samples", "individual_sample", "read_jsonl", "read_samples",
           "to_packed_tensors", "to_padded_tensors", "write_jsonl", "write_parquet"]

ExportStyle = Literal["individual", "concat"]
# Every export path (the control routes, the client, the collector, the runner, the training config)
# takes these two defaults from here.
DEFAULT_EXPORT_STYLE: ExportStyle = "individual"
NO_DISCOUNT = 1.0  # rewards reach every turn of a conversation undiscounted
PAD_TOKEN_ID = 0  # what padded tensors fill with (GRPOConfig.pad_token_id's default)


@dataclass(frozen=True)
class Lineage:
    """Conversations across forks (tree.py): lineage parent and conversation id per interaction."""

    parents: dict[str, str | None]
    conversations: dict[str, str]

    @classmethod
    def of(cls, done: list[Interaction]) -> Lineage:
        parents = lineage_parents(done)
        return cls(parents, conversation_ids(parents))


def _base(i: Interaction, first: Interaction, lineage: Lineage, task_id: str) -> dict[str, Any]:
    return {
        "id": i.id,
        "session_id": i.session_id,
        "task_id": task_id,
        "parent_id": i.parent_id,
        "relation": i.relation,
        "fork_reason": first.fork_reason,
        "conversation_id": lineage.conversations.get(first.id, first.id),
        "lineage_parent_id": lineage.parents.get(first.id),
        "api": i.api,
        "finish_reason": i.finish_reason,
        "messages": [message_to_openai(m) for m in i.messages],
        "output_message": message_to_openai(i.output_message) if i.output_message else None,
        "sampling": dict(i.sampling),
        "policy": i.policy,
    }


def individual_sample(i: Interaction, reward: float | None, task_id: str = "", lineage: Lineage | None = None) -> Sample:
    p, o = len(i.prompt_ids), len(i.output_ids)
    return Sample(
        **_base(i, i, lineage or Lineage.of([i]), task_id),
        input_ids=list(i.prompt_ids) + list(i.output_ids),
        loss_mask=[0] * p + [1] * o,
        logprobs=[0.0] * p + list(i.output_logprobs),
        versions=[-1] * p + list(i.output_versions),
        reward=reward,
        flags=reply_flags(i) + (["no_reward"] if reward is None else []),
    )


def concat_sample(chain: list[Interaction], rewards: dict[str, float | None], task_id: str = "",
                  lineage: Lineage | None = None) -> tuple[Sample, int]:
    """One sample for a root-to-leaf chain; returns it and how many turns were unaligned.

    A turn is aligned when its prompt + output tokens are a prefix of the leaf's
    sequence (always true in token_exact mode). Unaligned turns (re-rendered prompts
    that re-tokenized an earlier reply differently) get no loss in this sample.
    """
    leaf = chain[-1]
    ids = list(leaf.prompt_ids) + list(leaf.output_ids)
    n = len(ids)
    mask = [0] * n
    lps = [0.0] * n
    vers = [-1] * n
    unaligned = 0
    flags: list[str] = []
    for turn in chain:
        flags += [f for f in reply_flags(turn) if f not in flags]
        start = len(turn.prompt_ids)
        end = start + len(turn.output_ids)
        if turn is not leaf and (end > n or ids[:start] != turn.prompt_ids or ids[start:end] != turn.output_ids):
            unaligned += 1
            continue
        mask[start:end] = [1] * (end - start)
        lps[start:end] = turn.output_logprobs
        vers[start:end] = turn.output_versions
    sample = Sample(
        **_base(leaf, chain[0], lineage or Lineage.of(chain), task_id),
        chain=[t.id for t in chain],
        input_ids=ids,
        loss_mask=mask,
        logprobs=lps,
        versions=vers,
        reward=rewards.get(leaf.id),
        turn_rewards=[rewards.get(t.id) for t in chain],
        flags=flags + (["no_reward"] if rewards.get(leaf.id) is None else []) + (["unaligned"] if unaligned else []),
    )
    return sample, unaligned


def export_samples(
    interactions: Sequence[Interaction], *, style: ExportStyle = DEFAULT_EXPORT_STYLE, discount: float = NO_DISCOUNT,
    task_id: str = "",
) -> tuple[list[Sample], dict[str, int]]:
    """Samples for the completed interactions of one session (task ``task_id``), plus counts.

    Counts: ``completed``, ``failed``, ``pending``, ``root``, ``extend``, ``fork``
    (over completed interactions), ``conversations`` (lineage roots) and ``unaligned_turns``
    (concat only).
    """
    done = [i for i in interactions if i.completed]
    stats = {
        "completed": len(done),
        "failed": sum(1 for i in interactions if i.status == "failed"),
        "pending": sum(1 for i in interactions if i.status == "pending"),
        "root": sum(1 for i in done if i.relation == "root"),
        "extend": sum(1 for i in done if i.relation == "extend"),
        "fork": sum(1 for i in done if i.relation == "fork"),
    }
    lineage = Lineage.of(done)
    stats["conversations"] = len(set(lineage.conversations.values()))
    rewards = discounted_rewards(done, discount, lineage.parents)
    if style == "individual":
        return [individual_sample(i, rewards[i.id], task_id, lineage) for i in done], stats
    if style != "concat":
        raise ValueError(f"unknown export style {style!r}")
    kids = children_map(done)
    by_id = {i.id: i for i in done}
    samples: list[Sample] = []
    unaligned = 0
    for leaf in done:
        if kids[leaf.id]:
            continue
        s, u = concat_sample(chain_of(leaf, by_id), rewards, task_id, lineage)
        samples.append(s)
        unaligned += u
    stats["unaligned_turns"] = unaligned
    return samples, stats


# --------------------------------------------------------------------------- tensors

SampleLike = Sample | dict[str, Any]


def _as_sample(s: SampleLike) -> Sample:
    return s if isinstance(s, Sample) else Sample.from_dict(s)


def to_padded_tensors(samples: Sequence[SampleLike], *, pad_token_id: int = PAD_TOKEN_ID) -> dict[str, Any]:
    """Right-padded torch tensors of shape [B, max_len] (+ ``rewards`` [B]).

    ``attention_mask`` is 1 on real tokens; padding has loss_mask 0, logprobs 0.0,
    versions -1. Unset rewards become NaN so they cannot be mistaken for 0.
    """
    import torch

    if not samples:
        raise ValueError("no samples")
    rows = [_as_sample(s) for s in samples]
    max_len = max(len(s.input_ids) for s in rows)
    bsz = len(rows)
    out = {
        "input_ids": torch.full((bsz, max_len), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((bsz, max_len), dtype=torch.bool),
        "loss_mask": torch.zeros((bsz, max_len), dtype=torch.bool),
        "logprobs": torch.zeros((bsz, max_len), dtype=torch.float32),
        "versions": torch.full((bsz, max_len), -1, dtype=torch.long),
    }
    for b, s in enumerate(rows):
        n = len(s.input_ids)
        out["input_ids"][b, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        out["attention_mask"][b, :n] = True
        out["loss_mask"][b, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
        out["logprobs"][b, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
        out["versions"][b, :n] = torch.tensor(s.versions, dtype=torch.long)
    out["rewards"] = _rewards(rows)
    return out


def _rewards(rows: Sequence[Sample]) -> Any:
    import torch

    return torch.tensor([float("nan") if s.reward is None else float(s.reward) for s in rows], dtype=torch.float32)


def to_packed_tensors(samples: Sequence[SampleLike]) -> dict[str, Any]:
    """All samples concatenated into one row (varlen / flash-attention layout).

    Returns 1-D ``input_ids``, ``loss_mask``, ``logprobs``, ``versions`` of length
    sum(L_i), ``position_ids`` restarting at 0 for each sample, ``cu_seqlens``
    (int32, [B+1], cumulative lengths), ``max_seqlen`` and ``rewards`` [B].
    """
    import torch

    if not samples:
        raise ValueError("no samples")
    rows = [_as_sample(s) for s in samples]
    lens = [len(s.input_ids) for s in rows]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return {
        "input_ids": torch.tensor([t for s in rows for t in s.input_ids], dtype=torch.long),
        "loss_mask": torch.tensor([t for s in rows for t in s.loss_mask], dtype=torch.bool),
        "logprobs": torch.tensor([t for s in rows for t in s.logprobs], dtype=torch.float32),
        "versions": torch.tensor([t for s in rows for t in s.versions], dtype=torch.long),
        "position_ids": torch.cat([torch.arange(n, dtype=torch.long) for n in lens]),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "max_seqlen": max(lens),
        "rewards": _rewards(rows),
    }


# --------------------------------------------------------------------------- files

_JSON_FIELDS = ("messages", "output_message", "sampling")


def _as_dict(s: SampleLike) -> dict[str, Any]:
    return s.to_dict() if isinstance(s, Sample) else s


def write_jsonl(samples: Iterable[SampleLike], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(_as_dict(s), ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_samples(path: str | Path) -> list[Sample]:
    """Samples from a file written by :func:`write_jsonl` or :func:`write_parquet`."""
    path = Path(path)
    if path.suffix != ".parquet":
        return [Sample.from_dict(d) for d in read_jsonl(path)]
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    for row in rows:
        for k in _JSON_FIELDS:
            if isinstance(row.get(k), str):
                row[k] = json.loads(row[k])
    return [Sample.from_dict(row) for row in rows]


def write_parquet(samples: Sequence[SampleLike], path: str | Path) -> Path:
    """Parquet with typed token columns; nested message fields are stored as JSON text.

    One row per sample, one column per :class:`Sample` field that any row has (so a
    training step's dump has ``session_id``, ``task_id``, ``group_id``, ``episode`` and
    ``step`` columns). Readable with ``datasets.load_dataset("parquet", data_files=path)``,
    pandas, and :func:`read_samples`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for s in samples:
        d = _as_dict(s)
        row = {k: v for k, v in d.items() if k not in _JSON_FIELDS}
        for k in _JSON_FIELDS:
            if k in d:
                row[k] = json.dumps(d[k], ensure_ascii=False)
        rows.append(row)
    schema_fields = [
        pa.field("id", pa.string()),
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("versions", pa.list_(pa.int32())),
        pa.field("reward", pa.float64()),
    ]
    known = {f.name: f for f in schema_fields}
    table = pa.Table.from_pylist(rows)
    # Cast the token columns to compact types; keep everything else as inferred.
    cols = [table[f.name].cast(known[f.name].type) if f.name in known else table[f.name] for f in table.schema]
    table = pa.Table.from_arrays(cols, names=table.schema.names)
    pq.write_table(table, path)
    return Path(path)
