"""Simulated users of the real-model online proof: a checkable question, partial and delayed feedback, a
judge separate from the reward, and a second tenant of adversarial users.

Every conversation asks "Which is larger (or smaller), A or B? Answer with the number only." with a
pair from the training split of ``demo/tasks.py``'s math task (the held-out pairs are the held-out
check's). A reply is **correct** (:func:`correct`) when it states the right number and not the other
one: a degenerate reply - empty, repeated, word salad - never is.

* **Honest users** (the first tenant, ``1 - adversarial_share`` of the conversations): a share
  ``feedback_share`` gives a thumbs (up iff the reply is correct: what users want), the rest says
  nothing (partial feedback); a share ``outcome_share`` of those who answered also posts a delayed
  outcome ``outcome_delay`` conversations later (+1 the answer was right, -1 it was not).
* **Adversarial users** (a second tenant): thumbs inverted (up on wrong answers), and one request in
  ten is an attack the gateway must refuse: an outcome of 1e300, 64 KB of metadata, a reply preferred
  over itself (each must answer 400; counted).
* **The judge** (:class:`JudgedWindow`): every reply an honest user got is judged correct or not,
  whether or not that user gave feedback, by the same rule applied by the proof itself - not by any
  reward the trainer sees (the rewards are the users' partial, delayed and partly adversarial
  feedback, and the live groups' proxy score :func:`first_number_score`).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from rlgate.demo.tasks import math_task

__all__ = ["FORMAT", "JudgedWindow", "NumberCheck", "NumberUsers", "correct", "first_number_score"]

FORMAT = " Answer with the number only."
_NUMBER = re.compile(r"-?\d+")


def _pair(question: str) -> tuple[int, int, bool]:
    m = re.search(r"Which is (larger|smaller), (\d+) or (\d+)\?", question)
    if m is None:
        raise ValueError(f"not a comparison question: {question!r}")
    return int(m.group(2)), int(m.group(3)), m.group(1) == "larger"


def correct(question: str, reply: str) -> bool:
    """The reply states the right number and not the other one (any wording)."""
    a, b, larger = _pair(question)
    right, wrong = (max(a, b), min(a, b)) if larger else (min(a, b), max(a, b))
    numbers = {int(x) for x in _NUMBER.findall(reply)}
    return right in numbers and wrong not in numbers


def first_number_score(question: str, reply: str) -> float:
    """The live groups' reward, a cheaper proxy than the users' rule: +1 when the first number in the reply is
    the right one, -1 otherwise (a reply listing both numbers, right first, scores +1; users disapprove)."""
    a, b, larger = _pair(question)
    right = max(a, b) if larger else min(a, b)
    found = _NUMBER.findall(reply)
    return 1.0 if found and int(found[0]) == right else -1.0


class NumberCheck:
    """The held-out check (``--heldout-check``): held-out pairs the trainer never sees, judged by :func:`correct`."""

    def __init__(self, n: int = 32, seed: int = 0) -> None:
        items = math_task(seed).heldout[:n]
        self.prompts = [[{"role": "user", "content": d["question"] + FORMAT}] for d in items]

    def score(self, messages: list[dict[str, Any]], reply: str) -> float:
        return float(correct(messages[-1]["content"], reply))


@dataclass
class JudgedWindow:
    """The judge's verdicts on the replies honest users got, and what those users said."""

    verdicts: list[int] = field(default_factory=list)  # 1 correct, 0 not
    by_version: dict[int, list[int]] = field(default_factory=dict)
    thumbs: list[int] = field(default_factory=list)  # the users' own thumbs (those who gave one)

    def add(self, verdict: bool, version: int | None, thumb: bool | None) -> None:
        self.verdicts.append(int(verdict))
        if version is not None:
            self.by_version.setdefault(version, []).append(int(verdict))
        if thumb is not None:
            self.thumbs.append(int(thumb))

    @property
    def n(self) -> int:
        return len(self.verdicts)

    @property
    def rate(self) -> float:
        return sum(self.verdicts) / self.n if self.n else math.nan

    @property
    def stderr(self) -> float:
        p = self.rate
        return math.sqrt(p * (1 - p) / self.n) if self.n else math.nan

    def summary(self) -> dict[str, Any]:
        return {"judge_correct": self.rate, "stderr": self.stderr, "n": self.n,
                "users_thumbs_up": sum(self.thumbs) / len(self.thumbs) if self.thumbs else None,
                "thumbs": len(self.thumbs),
                "by_version": {str(v): {"correct": sum(x) / len(x), "n": len(x)} for v, x in sorted(self.by_version.items())}}

    def __str__(self) -> str:
        return f"{self.rate:.1%} ± {self.stderr:.1%} (n={self.n})"


@dataclass
class NumberUsers:
    """Both tenants' users (see the module docstring)."""

    base_url: str
    honest_key: str
    adversary_key: str
    max_tokens: int = 12
    feedback_share: float = 0.7
    outcome_share: float = 0.3
    outcome_delay: int = 20
    adversarial_share: float = 0.1
    seed: int = 0
    version_of: Callable[[str], int | None] | None = None  # a turn id -> the weight version that answered it
    conversations: int = 0
    errors: int = 0
    attacks: dict[str, int] = field(default_factory=lambda: {"sent": 0, "refused": 0})
    _rng: random.Random = field(init=False)
    _items: list[dict[str, Any]] = field(init=False)
    _outcomes: deque[tuple[int, str, float]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._items = math_task(self.seed).train

    async def run(self, n: int, *, concurrency: int = 16) -> JudgedWindow:
        """``n`` conversations (about ``adversarial_share`` of them adversarial); the honest ones are judged."""
        from openai import APIError, AsyncOpenAI

        window = JudgedWindow()
        clients = {key: AsyncOpenAI(base_url=self.base_url + "/v1", api_key=key, max_retries=0, timeout=600)
                   for key in (self.honest_key, self.adversary_key)}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=600) as http:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for _ in range(n):
                self.conversations += 1
                queue.put_nowait(self.conversations)

            async def worker() -> None:
                while not queue.empty():
                    k = queue.get_nowait()
                    adversary = self._rng.random() < self.adversarial_share
                    key = self.adversary_key if adversary else self.honest_key
                    try:
                        await self._conversation(clients[key], http, key, k, None if adversary else window)
                    except (APIError, httpx.HTTPError, RuntimeError) as exc:
                        self.errors += 1
                        if self.errors > max(10, n // 10):
                            raise RuntimeError(f"too many failed conversations; last: {exc!r}") from exc

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        for c in clients.values():
            await c.close()
        return window

    async def _conversation(self, oai: Any, http: httpx.AsyncClient, key: str, k: int,
                            window: JudgedWindow | None) -> None:
        item = self._rng.choice(self._items)
        question = item["question"] + FORMAT
        reply = await oai.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": question}], max_tokens=self.max_tokens,
            temperature=1.0, extra_headers={"x-conversation-id": f"number-{self.seed}-{k}"})
        text = reply.choices[0].message.content or ""
        ok = correct(question, text)
        auth = {"authorization": f"Bearer {key}"}
        thumb: bool | None = None
        if window is None:  # adversarial: inverted thumbs, and attacks the gateway must refuse
            await self._feedback(http, auth, {"kind": "thumbs", "value": not ok, "interaction_id": reply.id})
            if self._rng.random() < 0.1:
                await self._attack(http, auth, reply.id)
            return
        if self._rng.random() < self.feedback_share:
            thumb = ok
            await self._feedback(http, auth, {"kind": "thumbs", "value": ok, "interaction_id": reply.id})
            if self._rng.random() < self.outcome_share:
                self._outcomes.append((k + self.outcome_delay, reply.id, 1.0 if ok else -1.0))
        while self._outcomes and self._outcomes[0][0] <= k:
            _, iid, value = self._outcomes.popleft()
            await self._feedback(http, auth, {"kind": "outcome", "value": value, "interaction_id": iid,
                                              "source": "delayed"})
        window.add(ok, self.version_of(reply.id) if self.version_of is not None else None, thumb)

    async def _attack(self, http: httpx.AsyncClient, auth: dict[str, str], turn: str) -> None:
        bodies = [{"kind": "outcome", "value": 1e300, "interaction_id": turn},
                  {"kind": "thumbs", "value": True, "interaction_id": turn, "metadata": {"x": "y" * 65536}},
                  {"kind": "preference", "value": 1, "interaction_id": turn, "other_interaction_id": turn}]
        body = self._rng.choice(bodies)
        r = await http.post("/v1/feedback", json=body, headers=auth)
        self.attacks["sent"] += 1
        self.attacks["refused"] += int(r.status_code == 400)

    @staticmethod
    async def _feedback(http: httpx.AsyncClient, auth: dict[str, str], body: dict[str, Any]) -> None:
        r = await http.post("/v1/feedback", json=body, headers=auth)
        if r.status_code == 404:  # the turn was released or deleted meanwhile: a user's feedback can be late
            return
        if r.status_code >= 300:
            raise RuntimeError(f"POST /v1/feedback answered {r.status_code}: {r.text[:300]}")
