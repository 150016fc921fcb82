"""An LLM judge as a reward function: ``reward: rlgate.rewards.judge:Judge``.

A model behind any OpenAI-compatible ``/chat/completions`` endpoint (a hosted API, vLLM or
SGLang, ``rlgate serve`` with a session key, a fake) reads an episode — the task (the dataset
item), the conversation the agent had, its final reply — and a rubric, and answers with a score
in [0, 1]::

    reward: rlgate.rewards.judge:Judge
    reward_kwargs: {base_url: http://127.0.0.1:9000/v1, model: judge, rubric: "1 if the answer is correct"}

* **per group** (``await judge.score_group(episodes)``, the group form of the reward protocol,
  ``trajectory/reward.py``): the episodes of a GRPO group side by side in one request, scored
  relative to each other (as ART's RULER does) — what ``reward:`` uses for a training run's groups
  and ``--group-reward`` for live groups;
* **per episode** (``await judge(episode)``, the episode form): one request per episode — what an
  evaluation (``rlgate check``, ``eval_dataset``) uses.

The answer is read as JSON ``{"score": x, ...}`` (``{"scores": [...]}`` for a group), else the
first number in the text; scores are clamped to [0, 1]. Identical requests are answered from a
**cache** (in memory, and in ``cache_path`` — JSON lines — across runs). Each request has a
**timeout**; a judge that fails (timeout, HTTP error, no score in its answer) raises
:class:`JudgeError`, so the episode fails and is counted like any failed episode, unless
``on_error`` is a number, which is then the reward.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import httpx

DEFAULT_RUBRIC = ("Score how well the assistant accomplished the user's task: 1.0 fully and correctly, 0.0 not "
                  "at all or wrongly, values in between for partial success.")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeError(RuntimeError):
    """The judge gave no score (timeout, HTTP error, an answer without a score)."""


def render_trajectory(episode: Any, max_chars: int = 12_000) -> str:
    """The episode as the judge reads it: the messages of its last call, then the final reply."""
    if not episode.samples:
        return "(no model call recorded)"
    last = episode.samples[-1]
    lines = []
    for m in [*last.messages, *([last.output_message] if last.output_message else [])]:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = f"{m.get('role', '?')}: {content or ''}"
        if m.get("tool_calls"):
            text += " [tool calls: " + json.dumps(m["tool_calls"], ensure_ascii=False) + "]"
        lines.append(text)
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "…" + text[-max_chars:]


def _clamp(x: float) -> float:
    return min(max(float(x), 0.0), 1.0)


def parse_score(text: str) -> float:
    """``{"score": x}`` anywhere in ``text``, else its first number; JudgeError if neither."""
    for match in re.finditer(r"\{.*?\}", text, flags=re.S):
        try:
            obj = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("score"), (int, float)):
            return _clamp(obj["score"])
    found = _NUMBER.search(text)
    if found is None:
        raise JudgeError(f"the judge's answer holds no score: {text[:200]!r}")
    return _clamp(float(found.group(0)))


def parse_scores(text: str, n: int) -> list[float]:
    """``{"scores": [...]}`` (n of them), else the first n numbers of ``text``."""
    match = re.search(r"\{.*\}", text, flags=re.S)
    if match:
        try:
            obj = json.loads(match.group(0))
            if isinstance(obj, dict) and isinstance(obj.get("scores"), list) and len(obj["scores"]) == n:
                return [_clamp(x) for x in obj["scores"]]
        except (ValueError, TypeError):
            pass
    numbers = [m.group(0) for m in _NUMBER.finditer(text)]
    if len(numbers) < n:
        raise JudgeError(f"the judge's answer holds {len(numbers)} scores for {n} episodes: {text[:200]!r}")
    return [_clamp(float(x)) for x in numbers[:n]]


class Judge:
    """A reward function that asks a model (see the module docstring)."""

    def __init__(self, base_url: str, model: str = "judge", rubric: str = DEFAULT_RUBRIC, *,
                 api_key: str | None = None, api_key_env: str = "JUDGE_API_KEY", timeout: float = 60.0,
                 max_tokens: int = 256, temperature: float = 0.0, cache_path: str | None = None,
                 concurrency: int = 8, on_error: float | None = None, max_chars: int = 12_000) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.rubric = model, rubric
        self.api_key = api_key or os.environ.get(api_key_env)
        self.timeout, self.max_tokens, self.temperature = timeout, max_tokens, temperature
        self.on_error, self.max_chars = on_error, max_chars
        self.cache: dict[str, str] = {}  # request digest -> the judge's answer
        self.cache_path = Path(cache_path) if cache_path else None
        if self.cache_path is not None and self.cache_path.is_file():
            for line in self.cache_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self.cache[entry["key"]] = entry["answer"]
        self.requests = 0  # sent to the endpoint (cache misses)
        self._limit = asyncio.Semaphore(concurrency)
        self._http: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------ prompts

    def _task(self, episode: Any) -> str:
        return json.dumps(episode.data, ensure_ascii=False, default=str)[:2000]

    def episode_messages(self, episode: Any) -> list[dict[str, str]]:
        return [{"role": "system", "content": f"You are a strict judge. Rubric: {self.rubric}\n"
                 'Answer with one JSON object: {"score": <number from 0 to 1>, "reason": "<one sentence>"}.'},
                {"role": "user", "content": f"Task data: {self._task(episode)}\n\nTrajectory:\n"
                 f"{render_trajectory(episode, self.max_chars)}"}]

    def group_messages(self, episodes: list[Any]) -> list[dict[str, str]]:
        per = max(self.max_chars // max(len(episodes), 1), 500)
        body = "\n\n".join(f"## Trajectory {i + 1}\n{render_trajectory(e, per)}" for i, e in enumerate(episodes))
        return [{"role": "system", "content": f"You are a strict judge. Rubric: {self.rubric}\nYou see "
                 f"{len(episodes)} attempts at the same task; score each relative to the others. Answer with one "
                 'JSON object: {"scores": [<one number from 0 to 1 per trajectory, in order>]}.'},
                {"role": "user", "content": f"Task data: {self._task(episodes[0])}\n\n{body}"}]

    # ------------------------------------------------------------------ calls

    async def _ask(self, messages: list[dict[str, str]]) -> str:
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature}
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        if key in self.cache:
            return self.cache[key]
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with self._limit:
            self.requests += 1
            try:
                r = await self._http.post(self.url, json=body, headers=headers)
            except httpx.HTTPError as exc:
                raise JudgeError(f"judge {self.url}: {type(exc).__name__}: {exc or 'no answer'}") from None
        if r.status_code != 200:
            raise JudgeError(f"judge {self.url} answered HTTP {r.status_code}: {r.text[:200]}")
        try:
            answer = r.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge {self.url}: not a chat completion: {r.text[:200]}") from None
        self.cache[key] = answer
        if self.cache_path is not None:
            with self.cache_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "answer": answer}) + "\n")
        return answer

    async def __call__(self, episode: Any) -> float:
        """The episode's reward (``reward:`` calls this)."""
        try:
            return parse_score(await self._ask(self.episode_messages(episode)))
        except JudgeError:
            if self.on_error is None:
                raise
            return float(self.on_error)

    async def score_group(self, episodes: list[Any]) -> list[float]:
        """Rewards of a GRPO group's episodes, judged side by side in one request."""
        try:
            return parse_scores(await self._ask(self.group_messages(episodes)), len(episodes))
        except JudgeError:
            if self.on_error is None:
                raise
            return [float(self.on_error)] * len(episodes)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
