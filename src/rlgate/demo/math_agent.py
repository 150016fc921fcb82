"""Single-turn GSM8K-style math agents, written only against the public SDKs.

``MathAgent`` uses the Anthropic SDK (``/v1/messages``), ``OpenAIMathAgent`` the OpenAI
SDK (chat completions). Both send exactly one user message — the question, no system
prompt — and return reward 1.0 when the last number in the reply equals the answer (an item
with ``"format": "number"`` asks for the number alone: :func:`number_only_reward`)::

    reward = await MathAgent().run(
        {"question": "What is 2 + 3?", "answer": "5"},
        base_url=session.anthropic_base_url,   # gateway root: the SDK appends /v1/messages
        api_key=session.api_key,
    )
    reward = await OpenAIMathAgent().run(data, base_url=session.base_url,  # root + "/v1"
                                         api_key=session.api_key)

``data`` may also carry ``max_tokens`` and ``temperature`` (they override the agent's
defaults). ``http_client`` is passed to the SDK client as is (each SDK wants its own
HTTP client type); it is not closed by the agent.

They import nothing from rlgate: an agent is any code that talks to the gateway through
the public SDKs. ``examples/math_agent.py`` runs one episode against a running gateway.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["MathAgent", "OpenAIMathAgent", "closeness_reward", "extract_last_number", "math_reward"]

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def extract_last_number(text: str) -> float | None:
    """The last number in ``text`` (``1,234.5`` -> 1234.5), or None if there is none."""
    found = _NUMBER.findall(text or "")
    return float(found[-1].replace(",", "")) if found else None


def _answer_value(answer: str | int | float) -> float | None:
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    return extract_last_number(str(answer))  # "42", "1,234", or a GSM8K solution ending "#### 42"


def math_reward(reply: str, answer: str | int | float) -> float:
    """1.0 if the last number of ``reply`` equals ``answer`` (compared as numbers), else 0.0."""
    got, want = extract_last_number(reply), _answer_value(answer)
    if got is None or want is None:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=0.0, abs_tol=1e-6) else 0.0


def number_only_reward(reply: str, answer: str | int | float) -> float:
    """The answer *and* the format "answer with the number only": 1.0 if the reply is just the
    right number (whitespace and a final period aside); 0.5 if it is right but wordy (its first
    number is the answer: "The answer is 87."); else 0.0. Without the format term a model learns
    the skill and keeps the prose ("The 87-year-old ..." scored 1 under ``math_reward``)."""
    want = _answer_value(answer)
    text = (reply or "").strip().rstrip(".").strip()
    if want is None:
        return 0.0
    exact = _NUMBER.fullmatch(text)
    if exact is not None and math.isclose(float(text.replace(",", "")), want, rel_tol=0.0, abs_tol=1e-6):
        return 1.0
    found = _NUMBER.findall(text)
    if found and math.isclose(float(found[0].replace(",", "")), want, rel_tol=0.0, abs_tol=1e-6):
        return 0.5
    return 0.0


def number_first_reward(reply: str, answer: str | int | float) -> float:
    """:func:`number_only_reward` with partial credit only for a reply that *starts* with the right number
    ("52 is larger." 0.5; "The answer is 52." 0): the path from prose to the bare number is then one
    token (end the reply after the number), not a prefix to unlearn. The demo trains on it and measures
    with :func:`number_only_reward` (docs/training.md §6)."""
    score = number_only_reward(reply, answer)
    if score != 0.5:
        return score
    return 0.5 if _NUMBER.match((reply or "").strip()) else 0.0


def closeness_reward(reply: str, answer: str | int | float, scale: float = 10.0) -> float:
    """Partial credit: ``max(0, 1 - |last number - answer| / scale)``: 1.0 for the right answer, 0.9 one
    off, ..., 0.0 from ``scale`` off or without a number."""
    got, want = extract_last_number(reply), _answer_value(answer)
    if got is None or want is None:
        return 0.0
    return max(0.0, 1.0 - abs(got - want) / scale)


def reward_for(data: dict[str, Any]) -> Any:
    """The reward an item asks for: ``data["format"]`` ``"number"`` -> :func:`number_only_reward`,
    ``"number-first"`` -> :func:`number_first_reward`, ``"closeness"`` -> :func:`closeness_reward`, else
    :func:`math_reward`."""
    fmt = str(data.get("format"))
    by_format = {"number": number_only_reward, "number-first": number_first_reward, "closeness": closeness_reward}
    return by_format.get(fmt, math_reward)


class _Agent:
    def __init__(self, model: str = "rlgate", max_tokens: int = 32, temperature: float = 1.0) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature

    def _options(self, data: dict[str, Any]) -> tuple[str, int, float]:
        """The question (the one user message), max tokens and temperature of an episode."""
        return (str(data["question"]), int(data.get("max_tokens", self.max_tokens)),
                float(data.get("temperature", self.temperature)))


class MathAgent(_Agent):
    """The Anthropic SDK version."""

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from anthropic import AsyncAnthropic

        question, max_tokens, temperature = self._options(data)
        client = AsyncAnthropic(base_url=base_url, api_key=api_key, http_client=http_client)
        try:
            reply = await client.messages.create(
                model=self.model,
                max_tokens=max_tokens,
                messages=[{"role": "user", "content": question}],
                # temperature is a body field of the Messages API; recent SDKs no longer
                # have an argument for it, so it goes in extra_body (works with all).
                extra_body={"temperature": temperature},
            )
        finally:
            if http_client is None:
                await client.close()
        text = "".join(block.text for block in reply.content if block.type == "text")
        return reward_for(data)(text, data["answer"])


class OpenAIMathAgent(_Agent):
    """The OpenAI SDK (chat completions) version; ``base_url`` ends with ``/v1``."""

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from openai import AsyncOpenAI

        question, max_tokens, temperature = self._options(data)
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)
        try:
            reply = await client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": question}],
                max_tokens=max_tokens,
                temperature=temperature,
            )
        finally:
            if http_client is None:
                await client.close()
        return reward_for(data)(reply.choices[0].message.content or "", data["answer"])
