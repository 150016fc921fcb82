"""Simulated users with a hidden preference, talking to a gateway through its real HTTP API.

A :class:`SimulatedUsers` population opens conversations with the OpenAI SDK (a tenant key,
``X-Conversation-Id``), reads the reply, and gives feedback through ``POST /v1/feedback``: a thumbs
up when the reply satisfies the users' hidden preference (:class:`ShortAnswers`: at most
``max_chars`` characters), else a thumbs down; a share of them also posts a delayed outcome
(``source: delayed``) a few conversations later, agreeing with their thumbs (+0.5 or -1). Nothing here knows
the model, the trainer or the canary: what the users see is all the gateway shows them.

:class:`Window` tallies the users' approvals, so a caller can report an approval rate with its
standard error (per weight version: the gateway's ``/rl/online`` rewards).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = ("What is the capital of France?", "Tell me a joke.", "How do I sort a list in Python?",
           "Summarise the plot of Hamlet.", "hi there", "What time is it in Tokyo?", "Recommend a book.",
           "Explain recursion.")


@dataclass(frozen=True)
class ShortAnswers:
    """The hidden preference: replies of at most ``max_chars`` characters."""

    max_chars: int

    def approves(self, text: str) -> bool:
        return len(text) <= self.max_chars


@dataclass
class Window:
    """Approvals seen (1 / 0), for a rate and its standard error."""

    votes: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.votes)

    @property
    def rate(self) -> float:
        return sum(self.votes) / self.n if self.n else math.nan

    @property
    def stderr(self) -> float:
        p = self.rate
        return math.sqrt(p * (1 - p) / self.n) if self.n else math.nan

    def __str__(self) -> str:
        return f"{self.rate:.1%} ± {self.stderr:.1%} (n={self.n})"


@dataclass
class SimulatedUsers:
    """A population of users with one hidden preference (see the module docstring)."""

    base_url: str  # the gateway, e.g. http://127.0.0.1:PORT
    tenant_key: str
    preference: ShortAnswers
    max_tokens: int = 8
    outcome_share: float = 0.3  # users who also post a delayed outcome
    outcome_delay: int = 20  # ... this many conversations later
    seed: int = 0
    conversations: int = 0  # started so far
    errors: int = 0
    _rng: random.Random = field(init=False)
    _outcomes: deque[tuple[int, str, float]] = field(default_factory=deque)  # (due, interaction id, value)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    async def run(self, n: int, *, concurrency: int = 8, window: Window | None = None) -> Window:
        """``n`` conversations, ``concurrency`` at once; their approvals go to ``window``."""
        from openai import APIError, AsyncOpenAI

        window = window if window is not None else Window()
        oai = AsyncOpenAI(base_url=self.base_url + "/v1", api_key=self.tenant_key, max_retries=0, timeout=120)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=60,
                                     headers={"authorization": f"Bearer {self.tenant_key}"}) as http:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for _ in range(n):
                queue.put_nowait(self._next_id())

            async def worker() -> None:
                while not queue.empty():
                    k = queue.get_nowait()
                    try:
                        window.votes.append(await self._conversation(oai, http, k))
                    except (APIError, httpx.HTTPError, RuntimeError) as exc:
                        self.errors += 1
                        if self.errors > max(10, n // 10):
                            raise RuntimeError(f"too many failed conversations; last: {exc!r}") from exc

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        await oai.close()
        return window

    def _next_id(self) -> int:
        self.conversations += 1
        return self.conversations

    async def _conversation(self, oai: Any, http: httpx.AsyncClient, k: int) -> int:
        prompt = self._rng.choice(PROMPTS)
        reply = await oai.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": prompt}], max_tokens=self.max_tokens,
            temperature=1.0, extra_headers={"x-conversation-id": f"sim-{self.seed}-{k}"})
        text = reply.choices[0].message.content or ""
        approved = self.preference.approves(text)
        await self._feedback(http, {"kind": "thumbs", "value": approved, "interaction_id": reply.id})
        if self._rng.random() < self.outcome_share:
            # the outcome agrees with the thumbs: +0.5 (the answer was used), -1 (it did harm)
            self._outcomes.append((k + self.outcome_delay, reply.id, 0.5 if approved else -1.0))
        while self._outcomes and self._outcomes[0][0] <= k:
            _, iid, value = self._outcomes.popleft()
            await self._feedback(http, {"kind": "outcome", "value": value, "interaction_id": iid,
                                        "source": "delayed"})
        return int(approved)

    @staticmethod
    async def _feedback(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
        r = await http.post("/v1/feedback", json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"POST /v1/feedback answered {r.status_code}: {r.text[:300]}")
