"""The demo's agents: the example SDK agents, named so a TrainConfig can point at them."""

from __future__ import annotations

import zlib
from typing import Any

from rlgate.demo.calculator_agent import AnthropicCalculatorAgent, CalculatorAgent
from rlgate.demo.math_agent import MathAgent, OpenAIMathAgent


class EitherSDKMathAgent:
    """Half the questions (by a stable hash of the text) go through the Anthropic SDK
    ``MathAgent``, the other half through its OpenAI SDK twin: one policy trained from both surfaces."""

    def __init__(self, model: str = "rlgate", max_tokens: int = 32) -> None:
        self.anthropic = MathAgent(model=model, max_tokens=max_tokens)
        self.openai = OpenAIMathAgent(model=model, max_tokens=max_tokens)

    def pick(self, data: dict[str, Any]) -> Any:
        return self.anthropic if zlib.crc32(str(data["question"]).encode()) % 2 == 0 else self.openai

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        return await self.pick(data).run(data, base_url=base_url, api_key=api_key, http_client=http_client)



class EitherSDKCalculatorAgent:
    """The multi-turn calculator loop, half the questions (by the same stable hash) through the
    Anthropic SDK, the others through the OpenAI SDK; the options are the agents' own
    (``system``, ``reward``, ``max_tokens``...)."""

    def __init__(self, **options: Any) -> None:
        self.anthropic = AnthropicCalculatorAgent(**options)
        self.openai = CalculatorAgent(**options)

    def pick(self, data: dict[str, Any]) -> Any:
        return self.anthropic if zlib.crc32(str(data["question"]).encode()) % 2 == 0 else self.openai

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        return await self.pick(data).run(data, base_url=base_url, api_key=api_key, http_client=http_client)


__all__ = ["CalculatorAgent", "EitherSDKCalculatorAgent", "EitherSDKMathAgent"]
