"""The held-out check: the operator's fixed prompts and scorer, run on every candidate and on its stable version.

Live rewards can rise for the wrong reason (the reward is hacked); a check the trainer never sees can
say so. ``--heldout-check package.module:attribute`` names (operator configuration, loaded once at
start-up, never from a request) an object - or a class, instantiated without arguments - with

* ``prompts``: a sequence of chat conversations (lists of ``{"role", "content"}`` messages);
* ``score(messages, reply) -> float``: how good ``reply`` (text) is as an answer to ``messages``.

When a candidate starts serving, :func:`heldout_score` has its weights slot answer every prompt
greedily (``heldout_max_tokens`` tokens, off the user path: these requests are never recorded) and
averages the scores; the stable version's score is measured once per version. The guard
``online_heldout_drop`` (``online/hacking.py``) fires when the candidate scores more than
``heldout_margin`` below stable, and with ``guard_action`` ``pause`` no candidate is promoted
automatically before it has been scored.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from rlgate.engine.base import Engine, GenerateRequest, SamplingParams
from rlgate.object_spec import load_object

__all__ = ["HeldOutCheck", "heldout_score", "load_heldout"]


@runtime_checkable
class HeldOutCheck(Protocol):
    prompts: Sequence[list[dict[str, Any]]]

    def score(self, messages: list[dict[str, Any]], reply: str) -> float:
        ...


def load_heldout(path: str) -> HeldOutCheck:
    """The check named by the operator's configuration (``package.module:attribute``)."""
    obj = load_object(path, "heldout_check")
    if inspect.isclass(obj):
        obj = obj()
    if not isinstance(obj, HeldOutCheck) or not obj.prompts:
        raise ValueError(f"heldout_check {path!r}: needs .prompts (a non-empty list of conversations) and "
                         ".score(messages, reply)")
    return obj


async def heldout_score(check: HeldOutCheck, engine: Engine, *, encode: Callable[[list[dict[str, Any]]], list[int]],
                        decode: Callable[[list[int]], str], stop_token_ids: Sequence[int], max_tokens: int,
                        tag: str) -> float:
    """The mean score of ``engine``'s greedy replies to the check's prompts."""
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, stop_token_ids=tuple(stop_token_ids))
    prompts = list(check.prompts)
    results = await asyncio.gather(*(engine.generate(GenerateRequest(encode(m), sampling,
                                                                     request_id=f"heldout-{tag}-{i}"))
                                     for i, m in enumerate(prompts)))
    scores = [float(check.score(m, decode(r.output_ids))) for m, r in zip(prompts, results, strict=True)]
    return sum(scores) / len(scores)
