"""Responses API tools: what the model is shown, and how its calls go back to the client.

The Responses API has more tool types than Chat Completions' functions. Each becomes one or
more function specs the chat template can render, and each call the model makes goes back
to the client as the item type that tool defines:

============== ========================================== =====================================
tool type      shown to the model as                      a call goes back as
============== ========================================== =====================================
``function``   itself                                      ``function_call``
``namespace``  each member function / custom tool (name    ``function_call`` / ``custom_tool_call``
               as given; ``namespace.name`` when two        with ``namespace`` set
               namespaces share a name)
``custom``     a function with one string argument        ``custom_tool_call`` (``input`` = that
               ``input`` (the grammar, if any, is quoted    string)
               in its description)
``local_shell`` a function ``local_shell(command, ...)``  ``local_shell_call`` (``action`` =
                                                           ``{"type": "exec", ...arguments}``)
anything else  nothing (hosted tools: ``web_search``,      (the model cannot call it)
               ``file_search``, ``mcp``...)  — reported
               in ``x-rlgate-ignored-params`` as
               ``tools:TYPE``
============== ========================================== =====================================

Echoed calls (``custom_tool_call``, ``local_shell_call``, a ``function_call`` with a
``namespace``) are turned back into the very tool call the model generated, so a client
that sends its history back extends the recorded conversation token for token.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.api.common import tool_spec
from rlgate.api.openai_responses.protocol import (
    CustomToolParam,
    FunctionToolParam,
    LocalShellToolParam,
    NamespaceToolParam,
    OtherToolParam,
)
from rlgate.chat.conversation import ToolCall, ToolSpec
from rlgate.errors import InvalidRequest

ToolKind = Literal["function", "custom", "local_shell"]

LOCAL_SHELL = "local_shell"
LOCAL_SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments."},
        "working_directory": {"type": "string", "description": "Directory to run the command in."},
        "timeout_ms": {"type": "integer", "description": "Time limit in milliseconds."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["command"],
}


@dataclass(frozen=True)
class ToolInfo:
    kind: ToolKind
    name: str  # the name the client gave it (inside its namespace, if any)
    namespace: str | None = None


@dataclass
class ResponseTools:
    """The tools of one request: specs for the model, and the way back to the client's items."""

    specs: list[ToolSpec] = field(default_factory=list)
    by_name: dict[str, ToolInfo] = field(default_factory=dict)  # name the model sees -> tool
    ignored: list[str] = field(default_factory=list)  # "tools:web_search", ...
    echo: list[dict[str, Any]] = field(default_factory=list)  # the tools a response object lists

    def model_name(self, name: str, namespace: str | None = None) -> str:
        """The name the model sees for a client's (namespace, name)."""
        if namespace is not None:
            for seen, info in self.by_name.items():
                if info.namespace == namespace and info.name == name:
                    return seen
        return name

    def info(self, call_name: str) -> ToolInfo:
        return self.by_name.get(call_name) or ToolInfo("function", call_name)


def _custom_spec(name: str, t: CustomToolParam) -> ToolSpec:
    desc = t.description or ""
    fmt = t.format or {}
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        desc += (f"\n\nThe input must follow this {fmt.get('syntax', 'grammar')} grammar:\n{fmt['definition']}"
                 if desc else f"The input must follow this {fmt.get('syntax', 'grammar')} grammar:\n{fmt['definition']}")
    params = {"type": "object", "properties": {"input": {"type": "string", "description": "The tool's input."}},
              "required": ["input"]}
    return ToolSpec(name=name, description=desc or None, parameters=params)


def response_tools(tools: list[Any] | None) -> ResponseTools:
    out = ResponseTools()
    members: list[tuple[str, Any, str | None, str]] = []  # (name, tool, namespace, param)
    for i, t in enumerate(tools or []):
        if isinstance(t, NamespaceToolParam):
            for j, m in enumerate(t.tools):
                members.append((m.name, m, t.name, f"tools[{i}].tools[{j}]"))
            out.echo.append(t.model_dump(exclude_none=True))
        elif isinstance(t, (FunctionToolParam, CustomToolParam)):
            members.append((t.name, t, None, f"tools[{i}]"))
            if isinstance(t, FunctionToolParam):
                out.echo.append({"type": "function", "name": t.name, "description": t.description,
                                 "parameters": t.parameters if t.parameters is not None
                                 else {"type": "object", "properties": {}}, "strict": t.strict})
            else:
                out.echo.append(t.model_dump(exclude_none=True))
        elif isinstance(t, LocalShellToolParam):
            members.append((LOCAL_SHELL, t, None, f"tools[{i}]"))
            out.echo.append({"type": "local_shell"})
        elif isinstance(t, OtherToolParam):
            out.ignored.append(f"tools:{t.type}")
    counts = Counter(name for name, *_ in members)
    for name, t, namespace, param in members:
        seen = f"{namespace}.{name}" if namespace is not None and counts[name] > 1 else name
        if seen in out.by_name:
            raise InvalidRequest(f"tool names must be unique; {seen!r} is given twice", param=f"{param}.name")
        if isinstance(t, FunctionToolParam):
            out.specs.append(tool_spec(seen, t.description, t.parameters, f"{param}.parameters"))
            out.by_name[seen] = ToolInfo("function", name, namespace)
        elif isinstance(t, CustomToolParam):
            out.specs.append(_custom_spec(seen, t))
            out.by_name[seen] = ToolInfo("custom", name, namespace)
        else:
            out.specs.append(ToolSpec(name=LOCAL_SHELL, description="Run a shell command on the user's machine "
                                      "and get its output.", parameters=LOCAL_SHELL_PARAMETERS))
            out.by_name[seen] = ToolInfo("local_shell", LOCAL_SHELL)
    return out


# --------------------------------------------------------------------------- echoed calls -> tool calls


def custom_call(tools: ResponseTools, call_id: str, name: str, namespace: str | None, text: str) -> ToolCall:
    return ToolCall(call_id, tools.model_name(name, namespace), json.dumps({"input": text}, ensure_ascii=False))


def local_shell_call(call_id: str, action: dict[str, Any]) -> ToolCall:
    """The model's call back from an echoed action (``type``, nulls and an empty ``env``, which
    rlgate adds to every action, are not part of what the model wrote)."""
    args = {k: v for k, v in action.items() if k != "type" and v is not None and not (k == "env" and v == {})}
    return ToolCall(call_id, LOCAL_SHELL, json.dumps(args, ensure_ascii=False))


# --------------------------------------------------------------------------- tool calls -> output items


def _custom_input(call: Any) -> str:
    args = ToolCall(call.id, call.name, call.arguments).arguments_obj()
    if isinstance(args, dict) and isinstance(args.get("input"), str):
        return args["input"]
    return call.arguments  # the model did not follow the schema: pass its text on as is


def _local_shell_action(call: Any) -> dict[str, Any]:
    args = ToolCall(call.id, call.name, call.arguments).arguments_obj()
    action = {k: v for k, v in args.items() if k in LOCAL_SHELL_PARAMETERS["properties"]} \
        if isinstance(args, dict) else {}
    if isinstance(action.get("command"), str):
        action["command"] = ["bash", "-lc", action["command"]]
    action.setdefault("command", [])
    action.setdefault("env", {})  # required in the API's action object
    return {"type": "exec", **action}


def call_item(tools: ResponseTools, item_id: str, call: Any, status: str, *, complete: bool = True
              ) -> dict[str, Any]:
    """The output item for one tool call (``call``: a ToolCall or ToolCallDelta). ``complete``
    False gives the item as first announced in a stream (arguments / input still empty)."""
    info = tools.info(call.name)
    if info.kind == "custom":
        item = {"id": item_id, "type": "custom_tool_call", "status": status, "call_id": call.id, "name": info.name,
                "input": _custom_input(call) if complete else ""}
    elif info.kind == "local_shell":
        item = {"id": item_id, "type": "local_shell_call", "status": status, "call_id": call.id,
                "action": _local_shell_action(call)}
    else:
        item = {"id": item_id, "type": "function_call", "status": status, "call_id": call.id, "name": info.name,
                "arguments": call.arguments if complete else ""}
    if info.namespace is not None:
        item["namespace"] = info.namespace
    return item
