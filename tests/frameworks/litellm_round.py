"""LiteLLM completion(): one tool call, its result, the answer; openai/ (Chat) or anthropic/ (Messages)."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import litellm

url, key, kind = sys.argv[1:4]
tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
model, base = {"openai": ("openai/tiny", url + "/v1"), "anthropic": ("anthropic/tiny", url),
               "anthropic_v1": ("anthropic/tiny", url + "/v1")}[kind]
messages: list = [{"role": "user", "content": "What is 1 + 2?"}]
try:
    r = litellm.completion(model=model, api_base=base, api_key=key, messages=messages, tools=tools)
except Exception as exc:  # noqa: BLE001 - the error LiteLLM raises is the result
    print(json.dumps({"error": type(exc).__name__, "status": getattr(exc, "status_code", None)}))
    sys.exit(0)
msg = r.choices[0].message
call = msg.tool_calls[0]
messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "3"}]
r2 = litellm.completion(model=model, api_base=base, api_key=key, messages=messages, tools=tools)
print(json.dumps({"versions": {"litellm": version("litellm")}, "call": call.function.name,
                  "answer": r2.choices[0].message.content}))
