"""Which engine ``rlgate serve`` runs, and the options of the in-process ones.

The remote engines' options are in :mod:`rlgate.engine.remote.options`. The defaults here
are the engines' own (``LocalEngine`` and ``FakeEngine`` read them from this class).
"""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from rlgate.config import OPTIONS, option

__all__ = ["EngineKind", "EngineOptions"]

EngineKind = Literal["local", "fake", "sglang", "vllm"]


@dataclass(config=OPTIONS)
class EngineOptions:
    engine: EngineKind = option("local", "local: PyTorch in this process; fake: scripted replies; sglang / vllm: "
                                "drive inference servers (--backend-url)")
    device: str | None = option(None, "--engine local: torch device (none: cuda if available, else cpu)")
    max_batch_size: int = option(64, "--engine local: sequences decoded together", ge=1)
    max_rows_per_session: int | None = option(
        None, "--engine local: batch rows one session may hold (none: half of --max-batch-size)", ge=1)
    fake_output_tokens: int = option(16, "--engine fake: tokens per reply", ge=0)
    fake_token_delay: float = option(0.0, "--engine fake: seconds between tokens", ge=0)
    weight_check_tolerance: float | None = option(
        1e-3, "largest |served - probe| logprob difference a weight update may show: after loading a checkpoint "
        "that holds a probe (rlgate-probe.json, written by rlgate's trainer) the engine scores it and the update "
        "fails (502 weight_check_failed, previous weights kept) beyond this (float32: 1e-3; bfloat16 servers "
        "need ~0.1; none: no check)", metavar="T", ge=0)
