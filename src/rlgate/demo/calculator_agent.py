"""A multi-turn tool-using agent, written only against the public OpenAI SDK.

The model gets a question ("What is 37 + 48?") and a ``calculator`` tool. It should call
the tool, read the result, and answer. The agent runs the loop: every tool call is
executed locally (a small arithmetic evaluator, never ``eval``) and its result sent back
as a ``tool`` message, until the model answers in text or ``max_turns`` is reached.
Reward: 1.0 if the last number of the final answer equals the expected answer.

    reward = await CalculatorAgent().run({"question": "What is 37 + 48?", "answer": "85"},
                                         base_url=gateway_url, api_key=session_key)
"""

from __future__ import annotations

import ast
import json
import operator
from typing import TYPE_CHECKING, Any, cast

from rlgate.demo.math_agent import math_reward

__all__ = ["CalculatorAgent", "calculate"]

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


class CalculatorAgent:
    def __init__(self, model: str = "rlgate", max_tokens: int = 48, temperature: float = 1.0, max_turns: int = 3):
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_turns = max_turns

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": str(data["question"])}]
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
                    return math_reward(msg.content or "", data["answer"])
                for call in msg.tool_calls:
                    if call.type != "function":  # a custom (free-form) tool call: not offered
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": "error: unknown tool"})
                        continue
                    try:
                        args = json.loads(call.function.arguments or "{}")
                    except json.JSONDecodeError:
                        args = {}
                    result = calculate(args.get("expression")) if call.function.name == "calculator" \
                        else f"error: unknown tool {call.function.name}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            return 0.0  # never answered
        finally:
            if http_client is None:
                await client.close()
