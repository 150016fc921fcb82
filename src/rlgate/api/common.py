"""Helpers shared by the API surfaces: JSON body reading, tool schemas, SSE framing."""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from rlgate.api.errors import InvalidRequest
from rlgate.chat.conversation import ToolSpec

log = logging.getLogger("rlgate.api")

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request) -> Any:
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype.split(";")[0].lower():
        raise InvalidRequest(
            f"unsupported content type {ctype.split(';')[0]!r}; send application/json", status=415,
            code="unsupported_media_type",
        )
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc


def _loc(err: dict[str, Any]) -> str:
    parts = [str(p) for p in err.get("loc", ()) if not str(p).startswith("function-")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    first = errs[0]
    loc = _loc(first)
    msg = f"{loc}: {first['msg']}" if loc else first["msg"]
    if len(errs) > 1:
        msg += f" (and {len(errs) - 1} more error{'s' if len(errs) > 2 else ''})"
    return msg, loc or None


def parse_model(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise InvalidRequest(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        msg, loc = validation_message(exc)
        raise InvalidRequest(msg, param=loc) from exc


def extra_fields(model: BaseModel) -> list[str]:
    return sorted((model.model_extra or {}).keys())


def check_tool_schema(name: str, schema: Any, param: str) -> dict[str, Any]:
    """Validate a tool's input schema (JSON Schema object); return it (default: empty object)."""
    if schema is None:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"tool {name!r}: the input schema must be a JSON object", param=param)
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidRequest(f"tool {name!r}: invalid JSON schema: {exc.message}", param=param) from exc
    if schema.get("type", "object") != "object":
        raise InvalidRequest(f"tool {name!r}: the input schema must have type 'object'", param=param)
    return schema


def tool_spec(name: str, description: str | None, schema: Any, param: str) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters=check_tool_schema(name, schema, param))


def sse(data: Any, event: str | None = None) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def report_ignored(surface: str, names: list[str]) -> dict[str, str]:
    """Log parameters rlgate accepted but does not act on; return a response header for them."""
    if not names:
        return {}
    log.warning("%s: ignoring unsupported parameters: %s", surface, ", ".join(names))
    return {"x-rlgate-ignored-params": ",".join(names)}
