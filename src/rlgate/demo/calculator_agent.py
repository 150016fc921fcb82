"""A multi-turn tool-using agent, written only against the public OpenAI SDK.

The model gets a question ("What is 37 + 48?") and a ``calculator`` tool. It should call
the tool, read the result, and answer. The agent runs the loop: every tool call is
executed locally (a small arithmetic evaluator, never ``eval``) and its result sent back
as a ``tool`` message, until the model answers in text or ``max_turns`` is reached.
Reward: 1.0 if the last number of the final answer equals the expected answer; with
``reward="tool_round"`` only if that answer was also obtained through a tool round (a
calculator call returned it before the final answer: :func:`tool_round_reward`).

``system`` is an optional system message (a model whose chat template renders no tools, such as
SmolLM2's, is told about them there; the tools are passed as ``tools=`` all the same).
:class:`AnthropicCalculatorAgent` is the same loop on the Anthropic SDK (``tool_use`` /
``tool_result`` blocks).

    reward = await CalculatorAgent().run({"question": "What is 37 + 48?", "answer": "85"},
                                         base_url=gateway_url, api_key=session_key)
"""

from __future__ import annotations

import ast
import json
import operator
from typing import TYPE_CHECKING, Any, cast

from rlgate.demo.math_agent import math_reward

__all__ = ["AnthropicCalculatorAgent", "CalculatorAgent", "calculate", "tool_round_reward"]

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

CALCULATOR_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * and integers.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12 + 7"}},
            "required": ["expression"],
        },
    },
}

ANTHROPIC_CALCULATOR_TOOL: dict[str, Any] = {
    "name": CALCULATOR_TOOL["function"]["name"],
    "description": CALCULATOR_TOOL["function"].get("description", ""),
    "input_schema": CALCULATOR_TOOL["function"].get("parameters", {}),
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: Any) -> str:
    """Evaluate ``+ - *`` over integers (no names, calls or huge numbers); errors as text."""
    if not isinstance(expression, str) or len(expression) > 200:
        return "error: expected an arithmetic expression"

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](ev(node.left), ev(node.right))
            if abs(value) > 10**12:
                raise ValueError("number too large")
            return value
        raise ValueError("unsupported expression")

    try:
        return str(ev(ast.parse(expression, mode="eval")))
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"error: {exc}"


def tool_round_reward(reply: str, answer: str | int | float, tool_results: list[str]) -> float:
    """1.0 when the final ``reply`` gives ``answer`` (its last number) *and* a calculator call
    returned it earlier in the episode (the answer came from a tool round, not from the model's
    head); else 0.0."""
    if not math_reward(reply, answer):
        return 0.0
    return 1.0 if any(math_reward(result, answer) for result in tool_results) else 0.0


def _run_tool(name: str, args: Any) -> str:
    if name != "calculator":
        return f"error: unknown tool {name}"
    return calculate(args.get("expression") if isinstance(args, dict) else None)


class _CalculatorLoop:
    def __init__(self, model: str = "rlgate", max_tokens: int = 48, temperature: float = 1.0, max_turns: int = 3,
                 system: str | None = None, reward: str = "answer") -> None:
        if reward not in ("answer", "tool_round"):
            raise ValueError(f"reward must be 'answer' or 'tool_round', not {reward!r}")
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_turns = max_turns
        self.system = system
        self.reward = reward

    def score(self, reply: str, data: dict[str, Any], tool_results: list[str]) -> float:
        if self.reward == "tool_round":
            return tool_round_reward(reply, data["answer"], tool_results)
        return math_reward(reply, data["answer"])


class CalculatorAgent(_CalculatorLoop):
    """The OpenAI SDK (chat completions) version; ``base_url`` ends with ``/v1``."""

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        messages: list[ChatCompletionMessageParam] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": str(data["question"])})
        results: list[str] = []
        try:
            for _ in range(self.max_turns):
                reply = await client.chat.completions.create(
                    model=self.model, messages=messages, tools=[CALCULATOR_TOOL],
                    max_tokens=int(data.get("max_tokens", self.max_tokens)),
                    temperature=float(data.get("temperature", self.temperature)),
                )
                msg = reply.choices[0].message
                # echo the reply back unchanged
                messages.append(cast("ChatCompletionMessageParam", msg.model_dump(exclude_none=True)))
                if not msg.tool_calls:
                    return self.score(msg.content or "", data, results)
                for call in msg.tool_calls:
                    if call.type != "function":  # a custom (free-form) tool call: not offered
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": "error: unknown tool"})
                        continue
                    try:
                        args = json.loads(call.function.arguments or "{}")
                    except json.JSONDecodeError:
                        args = {}
                    result = _run_tool(call.function.name, args)
                    results.append(result)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            return 0.0  # never answered
        finally:
            if http_client is None:
                await client.close()


class AnthropicCalculatorAgent(_CalculatorLoop):
    """The Anthropic SDK (Messages) version; ``base_url`` is the gateway's root."""

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from anthropic import AsyncAnthropic, omit

        client = AsyncAnthropic(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": str(data["question"])}]
        results: list[str] = []
        try:
            for _ in range(self.max_turns):
                reply = await client.messages.create(
                    model=self.model, messages=cast("Any", messages), tools=[cast("Any", ANTHROPIC_CALCULATOR_TOOL)],
                    max_tokens=int(data.get("max_tokens", self.max_tokens)),
                    # no temperature keyword in recent SDKs: a body field (see math_agent.py)
                    extra_body={"temperature": float(data.get("temperature", self.temperature))},
                    system=self.system or omit,
                )
                # echo the reply back unchanged
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                  for b in reply.content]})
                calls = [b for b in reply.content if b.type == "tool_use"]
                if not calls:
                    return self.score("".join(b.text for b in reply.content if b.type == "text"), data, results)
                blocks = []
                for call in calls:
                    result = _run_tool(call.name, call.input)
                    results.append(result)
                    blocks.append({"type": "tool_result", "tool_use_id": call.id, "content": result})
                messages.append({"role": "user", "content": blocks})
            return 0.0  # never answered
        finally:
            if http_client is None:
                await client.close()
