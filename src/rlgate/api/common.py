"""Helpers shared by the API surfaces: JSON body reading, tool schemas, SSE framing."""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from rlgate.chat.conversation import ToolSpec
from rlgate.errors import InvalidRequest
from rlgate.json_text import dumps
from rlgate.surfaces import sse_frame

log = logging.getLogger("rlgate.api")

M = TypeVar("M", bound=BaseModel)


def nesting_depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists / objects deeper than ``limit``.

    Level by level, holding only containers: every value is looked at once, scalars are never
    stacked (a 3.6 MB body of tool schemas: 0.43 s on the event loop pushing and popping every
    string; this way a fraction of that)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below = []
        for v in level:
            for x in (v.values() if type(v) is dict else v):
                if type(x) in _CONTAINERS:
                    below.append(x)
        level = below
    return False


_CONTAINERS = (dict, list)  # what json.loads makes (exact types: no subclasses come from it)


def check_depth(value: Any, limit: int, what: str = "the request body", param: str | None = None) -> None:
    """400 when ``value`` nests deeper than ``limit``: recursive code below (JSON Schema checks,
    templates, canonical forms) must never meet a RecursionError."""
    if nesting_depth_over(value, limit):
        raise InvalidRequest(f"{what} is nested more than {limit} levels deep (max_json_depth)", param=param,
                             code="too_deeply_nested")


async def read_json(request: Request) -> Any:
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype.split(";")[0].lower():
        raise InvalidRequest(
            f"unsupported content type {ctype.split(';')[0]!r}; send application/json", status=415,
            code="unsupported_media_type",
        )
    raw = await request.body()
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise InvalidRequest("the request body is nested too deeply", code="invalid_json") from exc
    if _MAYBE_SURROGATE.search(raw) and has_lone_surrogate(data):
        raise InvalidRequest("the request body contains an unpaired UTF-16 surrogate (e.g. \\ud800); "
                             "strings must be valid Unicode", code="invalid_unicode")
    limit = request.app.state.gateway.config.max_json_depth
    if raw.count(b"[") + raw.count(b"{") > limit:  # fewer brackets than the limit cannot nest deeper
        check_depth(data, limit)
    return data


# json.loads accepts "\ud800" escapes (and, in bytes, UTF-8-encoded surrogates) that pair with
# nothing; such strings cannot be tokenized, stored or sent back. A cheap scan of the raw body
# decides whether the parsed value needs the full check.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # json.loads would accept NaN / Infinity


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def has_non_finite(value: Any) -> bool:
    """Whether ``value`` (parsed JSON) holds NaN or an infinity anywhere. Bodies FastAPI parses
    (the control routes) come from ``json.loads``, which takes ``NaN``, ``Infinity`` and
    ``1e999``; a free-form value (session metadata) would keep them, and the store writes them
    as ``null``."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is float:
            if not math.isfinite(v):
                return True
        elif type(v) is dict:
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
    return False


# Names pydantic puts in an error's location for the member of a union it tried (``str``,
# ``list[...]``, a model's class name); they are not fields of the request.
_BRANCH_NAMES = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "bytes"})


def _is_branch(part: str) -> bool:
    return "[" in part or part in _BRANCH_NAMES or part[:1].isupper() or part.startswith("function-")


def _loc(err: Mapping[str, Any], data: Any = None, skip: tuple[str, ...] = ()) -> str:
    """The request field an error is about, as ``messages[0].content[1].text``. pydantic's
    location also names the union member it tried (``str``, ``list[...]``, a class name, a
    tagged union's tag: ``tools[0].function.name`` for a Responses tool); those parts are
    dropped. With ``data`` (the parsed body) the location is followed through it: a part that
    is neither a key nor an index there is a member name, unless it is the last (a missing
    field)."""
    raw = [str(p) if not isinstance(p, int) else p for p in err.get("loc", ())]
    parts: list[str] = []
    here = data
    for n, p in enumerate(raw):
        if isinstance(p, int):
            parts.append(str(p))
            here = here[p] if isinstance(here, list) and -len(here) <= p < len(here) else None
            continue
        if _is_branch(p) or (not parts and p in skip):
            continue
        if isinstance(here, dict) and p in here:
            here = here[p]
        elif data is not None and n < len(raw) - 1:
            continue  # not a field of the value there: a tag
        elif data is None and parts and parts[-1] == p:
            continue  # ('image_url', 'image_url'): a tag, then the field of that name
        else:
            here = None
        parts.append(p)
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def describe_errors(errs: list[Any], data: Any = None, skip: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """One message for pydantic's errors, and the field it names: the most specific error (the
    deepest location: an unknown content part, not "content should be a string"), and how
    many others there are. ``data``: the parsed body (see :func:`_loc`); ``skip``: a leading
    location part that is not a field (``body``)."""
    if not errs:
        return "invalid request", None
    best = max(errs, key=lambda e: len(e.get("loc", ())))  # the first of the deepest
    loc = _loc(best, data, skip)
    msg = f"{loc}: {best['msg']}" if loc else str(best["msg"])
    if len(errs) > 1:
        msg += f" (and {len(errs) - 1} more error{'s' if len(errs) > 2 else ''})"
    return msg, loc or None


def validation_message(exc: ValidationError, data: Any = None) -> tuple[str, str | None]:
    return describe_errors(exc.errors(), data)


def parse_model(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise InvalidRequest(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        msg, loc = validation_message(exc, data)
        raise InvalidRequest(msg, param=loc) from exc


def extra_fields(model: BaseModel) -> list[str]:
    return sorted((model.model_extra or {}).keys())


def check_tool_schema(name: str, schema: Any, param: str) -> dict[str, Any]:
    """Validate a tool's input schema (JSON Schema object); return it (default: empty object).

    The schema is checked against the Draft 2020-12 meta-schema by ``jsonschema_rs`` (Rust).
    ``jsonschema``'s ``check_schema`` did the same in Python on the event loop at ~0.6 ms per
    property: one 20 KB tool list (``anyOf`` of 5,000 empty schemas) held every request of the
    gateway for 2.5 s, a 14 MB one for minutes. Here that list takes ~3 ms. The schema is data
    for the check: nothing it names (``$schema``, ``$ref``) is fetched or resolved.
    """
    if schema is None:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"tool {name!r}: the input schema must be a JSON object", param=param)
    try:
        error = next(_meta_schema().iter_errors(schema), None)
    except (ValueError, RecursionError) as exc:  # read_json bounds the depth; a direct caller may not have
        raise InvalidRequest(f"tool {name!r}: the input schema is nested too deeply", param=param,
                             code="too_deeply_nested") from exc
    if error is not None:
        where = "/".join(str(p) for p in error.instance_path)
        at = f" (at {where})" if where else ""
        raise InvalidRequest(f"tool {name!r}: invalid JSON schema{at}: {error.message}", param=param)
    if schema.get("type", "object") != "object":
        raise InvalidRequest(f"tool {name!r}: the input schema must have type 'object'", param=param)
    return schema


@functools.cache
def _meta_schema() -> Any:
    """The Draft 2020-12 meta-schema as a compiled validator (built once, ~3 ms; offline: its
    vocabularies are bundled, nothing is retrieved)."""
    import jsonschema_rs
    from jsonschema_specifications import REGISTRY

    meta = REGISTRY.contents("https://json-schema.org/draft/2020-12/schema")
    return jsonschema_rs.Draft202012Validator(meta, offline=True)


def tool_spec(name: str, description: str | None, schema: Any, param: str) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters=check_tool_schema(name, schema, param))


class JsonResponse(JSONResponse):
    """A JSON response encoded by :mod:`rlgate.json_text` (every JSON response of the app)."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


sse = sse_frame  # one SSE encoder for the gateway and the router (rlgate.surfaces)


MAX_REPORTED_PARAMS = 32  # names in the header / log line; the rest is counted


def _param_name(name: str, limit: int = 64) -> str:
    """A client-chosen field name made safe for a header and a log line (ASCII, no control chars),
    at most ``limit`` characters, cut between escapes (never inside one)."""
    if name.isascii() and name.isprintable() and "," not in name:
        return name[:limit]
    out: list[str] = []
    size = 0
    for ch in name:
        e = ch if ch.isascii() and ch.isprintable() and ch != "," else json.dumps(ch)[1:-1].replace(",", "\\u002c")
        if size + len(e) > limit:
            break
        out.append(e)
        size += len(e)
    return "".join(out)


def retry_attempt(request: Request) -> int:
    """The Stainless SDKs' (OpenAI, Anthropic) ``x-stainless-retry-count``: 0 for a first attempt."""
    value = request.headers.get("x-stainless-retry-count", "")
    return min(int(value), 1000) if value.isascii() and value.isdigit() else 0


def template_dropped(parts: list[str]) -> dict[str, str]:
    """The response header naming what the chat template left out of the prompt (chat/template_support.py)."""
    return {"x-rlgate-template-dropped": ",".join(parts)} if parts else {}


def report_ignored(surface: str, names: list[str]) -> dict[str, str]:
    """Log parameters rlgate accepted but does not act on; return a response header for them."""
    if not names:
        return {}
    shown = [_param_name(n) for n in names[:MAX_REPORTED_PARAMS]]
    if len(names) > MAX_REPORTED_PARAMS:
        shown.append(f"...(+{len(names) - MAX_REPORTED_PARAMS})")
    log.warning("%s: ignoring unsupported parameters: %s", surface, ", ".join(shown))
    return {"x-rlgate-ignored-params": ",".join(shown)}
