"""Exported samples in the layouts other trainers read as they are: TRL, verl, OpenRLHF, plain JSONL.

``rlgate export --format F`` (and :func:`write_format`) turns rlgate's samples
(:class:`~rlgate.trajectory.sample.Sample`: ``concat`` style = one per conversation chain, loss
on every generated segment; ``individual`` = one per LLM call) into one row per sample in the
target's columns. Every row carries ``schema_version`` (``"rlgate.<format>/<N>"``: bumped when a
column changes meaning or goes away) and the ids it came from. The token columns are rlgate's own
capture, not a re-tokenization: ``prompt_ids`` are the tokens before the first generated one,
``response_ids`` everything after (generated tokens and, in a multi-turn chain, the tool / user
tokens between turns), ``response_mask`` is 1 exactly on the generated tokens, and
``response_logprobs`` holds the engine's behaviour logprobs there (0.0 elsewhere). A sample
without a generated token has nothing to train on and is left out (counted).

Columns per format (docs/integrations.md has the table with what each reader does with them):

* ``trl`` (Parquet) — ``prompt`` and ``completion`` as conversational messages (GRPO / SFT text
  columns), ``input_ids`` + ``assistant_masks`` (``SFTTrainer`` trains a pre-tokenized dataset on
  the tokens where ``assistant_masks`` is 1: the generated ones), ``reward``, the token columns.
* ``verl`` (Parquet) — ``RLHFDataset``'s ``data_source`` / ``prompt`` / ``ability`` /
  ``reward_model`` / ``extra_info`` (``index``), ``MultiTurnSFTDataset``'s ``messages``, and the
  agent loop's ``prompt_ids`` / ``response_ids`` / ``response_mask`` / ``response_logprobs``.
* ``openrlhf`` (JSONL) — ``input`` (prompt messages: ``--input_key input --apply_chat_template``),
  ``output`` (the messages after it: ``--output_key output``), ``messages`` (both: ``--multiturn``),
  ``reward``, the token columns.
* ``jsonl`` — rlgate's own sample wire form (docs/trajectory-format.md) plus ``schema_version``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlgate.trajectory.sample import Sample

__all__ = ["FORMATS", "SCHEMA_VERSIONS", "ExportFormat", "FormatResult", "Split", "format_rows", "sample_from_row",
           "split", "write_format"]

ExportFormat = Literal["trl", "verl", "openrlhf", "jsonl"]
FORMATS: tuple[ExportFormat, ...] = ("trl", "verl", "openrlhf", "jsonl")
SCHEMA_VERSIONS: dict[str, str] = {f: f"rlgate.{f}/1" for f in FORMATS}
SUFFIX: dict[str, str] = {"trl": ".parquet", "verl": ".parquet", "openrlhf": ".jsonl", "jsonl": ".jsonl"}


@dataclass(frozen=True)
class Split:
    """A sample cut at its first generated token."""

    prompt_ids: list[int]  # tokens before the first generated one
    response_ids: list[int]  # every token after: generated, and tool / user tokens between turns
    response_mask: list[int]  # 1 on generated tokens, 0 on the others
    response_logprobs: list[float]  # behaviour logprob of each generated token, 0.0 elsewhere
    response_versions: list[int]  # weight version of each generated token, -1 elsewhere


def split(s: Sample) -> Split | None:
    """``s`` cut at its first generated token; None when it has none."""
    start = next((k for k, m in enumerate(s.loss_mask) if m), None)
    if start is None:
        return None
    return Split(list(s.input_ids[:start]), list(s.input_ids[start:]), [int(m) for m in s.loss_mask[start:]],
                 [float(x) for x in s.logprobs[start:]], list(s.versions[start:]))


def conversation(s: Sample) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(prompt messages, the messages after them): the prompt is what preceded the first reply."""
    msgs = list(s.messages) + ([s.output_message] if s.output_message else [])
    first = next((k for k, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    return msgs[:first], msgs[first:]


def _ids(s: Sample, schema: str) -> dict[str, Any]:
    return {"schema_version": schema, "id": s.id, "session_id": s.session_id, "task_id": s.task_id,
            "conversation_id": s.conversation_id, "chain": list(s.chain or [s.id]), "finish_reason": s.finish_reason,
            "flags": list(s.flags)}


def _tokens(sp: Split) -> dict[str, Any]:
    return {"prompt_ids": sp.prompt_ids, "response_ids": sp.response_ids, "response_mask": sp.response_mask,
            "response_logprobs": sp.response_logprobs, "response_versions": sp.response_versions}


def trl_row(s: Sample, sp: Split, index: int) -> dict[str, Any]:
    prompt, completion = conversation(s)
    return {**_ids(s, SCHEMA_VERSIONS["trl"]), "prompt": prompt, "completion": completion,
            "input_ids": list(s.input_ids), "assistant_masks": [int(m) for m in s.loss_mask],
            "reward": s.reward, **_tokens(sp)}


def verl_row(s: Sample, sp: Split, index: int) -> dict[str, Any]:
    prompt, completion = conversation(s)
    return {**_ids(s, SCHEMA_VERSIONS["verl"]), "data_source": "rlgate", "prompt": prompt, "ability": "agent",
            "reward_model": {"style": "recorded", "ground_truth": ""},
            "extra_info": {"index": index, "session_id": s.session_id, "id": s.id, "reward": s.reward},
            "messages": prompt + completion, "reward": s.reward, **_tokens(sp)}


def openrlhf_row(s: Sample, sp: Split, index: int) -> dict[str, Any]:
    prompt, completion = conversation(s)
    return {**_ids(s, SCHEMA_VERSIONS["openrlhf"]), "input": prompt, "output": completion,
            "messages": prompt + completion, "reward": s.reward, **_tokens(sp)}


def jsonl_row(s: Sample, sp: Split, index: int) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSIONS["jsonl"], **s.to_dict()}


ROWS: dict[str, Callable[[Sample, Split, int], dict[str, Any]]] = {
    "trl": trl_row, "verl": verl_row, "openrlhf": openrlhf_row, "jsonl": jsonl_row}


@dataclass(frozen=True)
class FormatResult:
    path: Path
    rows: int  # rows written
    skipped: int  # samples left out: no generated token


_JSON_TEXT_FIELDS = ("messages", "output_message", "sampling")  # stored as JSON text by write_parquet


def sample_from_row(row: dict[str, Any]) -> Sample:
    """A :class:`Sample` from a row of a samples file (JSONL, or Parquet with JSON-text message fields)."""
    row = dict(row)
    for k in _JSON_TEXT_FIELDS:
        if isinstance(row.get(k), str):
            row[k] = json.loads(row[k])
    return Sample.from_dict(row)


def format_rows(samples: Iterable[Sample | dict[str, Any]], fmt: ExportFormat) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``fmt`` for ``samples`` and how many were left out (no generated token)."""
    if fmt not in ROWS:
        raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
    rows: list[dict[str, Any]] = []
    skipped = 0
    for s in samples:
        sample = s if isinstance(s, Sample) else sample_from_row(s)
        sp = split(sample)
        if sp is None:
            skipped += 1
            continue
        rows.append(ROWS[fmt](sample, sp, len(rows)))
    return rows, skipped


def write_format(samples: Iterable[Sample | dict[str, Any]], fmt: ExportFormat, path: str | Path) -> FormatResult:
    """Write ``samples`` as ``fmt`` to ``path`` (Parquet for trl / verl, JSON lines otherwise)."""
    rows, skipped = format_rows(samples, fmt)
    path = Path(path)
    if SUFFIX[fmt] == ".parquet":
        _write_parquet(rows, path)
    else:
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return FormatResult(path, len(rows), skipped)


_TOKEN_TYPES = {"input_ids": "int32", "prompt_ids": "int32", "response_ids": "int32", "assistant_masks": "int8",
                "response_mask": "int8", "response_versions": "int32", "response_logprobs": "float32"}
_MESSAGE_COLUMNS = ("prompt", "completion", "messages")


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Parquet with compact token columns. Message lists keep their structure (Arrow structs), so
    ``datasets`` / pandas give back lists of dicts, in one shape for every row (:func:`_flat_message`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        pq.write_table(pa.table({"schema_version": pa.array([], pa.string())}), path)
        return
    for row in rows:
        for col in _MESSAGE_COLUMNS:
            if col in row:
                row[col] = [_flat_message(m) for m in row[col]]
    table = pa.Table.from_pylist(rows)
    cols = [table[name].cast(pa.list_(getattr(pa, _TOKEN_TYPES[name])())) if name in _TOKEN_TYPES
            else table[name] for name in table.schema.names]
    pq.write_table(pa.Table.from_arrays(cols, names=table.schema.names), path)


def _flat_message(m: dict[str, Any]) -> dict[str, Any]:
    """The message in one Arrow type whatever the client sent: role, content as text (text parts
    joined; image parts are not carried), OpenAI-form tool calls (arguments as JSON text), name,
    tool_call_id. ``reasoning_content`` is not carried (its tokens are in the token columns)."""
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out: dict[str, Any] = {"role": str(m.get("role", "")), "content": content or ""}
    if m.get("tool_calls"):
        out["tool_calls"] = [_flat_call(c) for c in m["tool_calls"]]
    if m.get("tool_call_id"):
        out["tool_call_id"] = str(m["tool_call_id"])
    if m.get("name"):
        out["name"] = str(m["name"])
    return out


def _flat_call(c: dict[str, Any]) -> dict[str, Any]:
    fn = c.get("function") or {}
    args = fn.get("arguments", "")
    return {"id": str(c.get("id", "")), "type": "function",
            "function": {"name": str(fn.get("name", "")),
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}
