"""rlgate's internal conversation model: what every API surface converts to.

OpenAI Chat Completions, OpenAI Responses and Anthropic Messages requests all become
a list of :class:`Message` plus a list of :class:`ToolSpec`. Rendering, the
conversation tree and the trajectory only ever see this model.

Canonical form
--------------
Two requests are "the same conversation so far" when the canonical forms of their
messages agree. :func:`canonical_message` removes differences that do not change the
conversation:

* key order, ``None`` / missing fields, and empty strings vs absent content;
* content given as a string vs a list of text parts (text parts are joined);
* tool-call arguments given as a JSON string vs an object (both are parsed; an
  unparsable string is kept verbatim);
* tool-call ids and the ``tool_call_id`` of tool results (clients and SDKs rewrite
  them; the position of the message already ties a result to its call);
* assistant reasoning (clients usually drop it when echoing a reply back; the
  trajectory keeps the generated tokens anyway) and surrounding whitespace of
  assistant text.

Images are compared by a hash of their data or URL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class TextPart:
    text: str
    type: Literal["text"] = "text"


@dataclass
class ImagePart:
    """An image given inline (base64 ``data`` + ``media_type``) or by ``url``.

    Text-only models see the placeholder the chat template renders for an image;
    the image itself is kept in the recorded messages.
    """

    data: str | None = None
    media_type: str | None = None
    url: str | None = None
    type: Literal["image"] = "image"

    def digest(self) -> str:
        return hashlib.sha256((self.data or self.url or "").encode()).hexdigest()[:16]


ContentPart = TextPart | ImagePart


@dataclass
class ToolCall:
    id: str  # call id as given to / by the client
    name: str
    arguments: str  # JSON text, exactly as generated or as received

    def arguments_obj(self) -> Any:
        """Arguments parsed as JSON, or the raw string when it is not valid JSON."""
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except (json.JSONDecodeError, ValueError):
            return self.arguments


@dataclass
class Message:
    role: Role
    content: list[ContentPart] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)  # assistant only
    tool_call_id: str | None = None  # tool only
    name: str | None = None  # tool name (tool results) or participant name
    reasoning: str | None = None  # assistant reasoning ("thinking")
    is_error: bool = False  # tool results: the tool failed

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def has_images(self) -> bool:
        return any(isinstance(p, ImagePart) for p in self.content)

    @classmethod
    def of(cls, role: Role, text: str | None = None, **kw: Any) -> Message:
        return cls(role=role, content=[TextPart(text)] if text else [], **kw)


@dataclass
class ToolSpec:
    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}


# --------------------------------------------------------------------------- canonical


def _canonical_content(msg: Message) -> Any:
    if not msg.has_images:
        text = msg.text
        return text.strip() if msg.role == "assistant" else text
    parts: list[Any] = []
    for p in msg.content:
        if isinstance(p, TextPart):
            if parts and isinstance(parts[-1], str):
                parts[-1] += p.text
            else:
                parts.append(p.text)
        else:
            parts.append({"image": p.digest()})
    return parts


def canonical_message(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg.role, "content": _canonical_content(msg)}
    if msg.tool_calls:
        out["tool_calls"] = [[tc.name, tc.arguments_obj()] for tc in msg.tool_calls]
    if msg.role == "tool" and msg.is_error:
        out["is_error"] = True
    return out


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_digest(msg: Message) -> str:
    return hashlib.sha256(canonical_json(canonical_message(msg)).encode()).hexdigest()


def tools_digest(tools: list[ToolSpec], template_kwargs: dict[str, Any] | None = None) -> str:
    """Digest of everything besides the messages that changes the rendering."""
    payload = [[t.name, t.description, t.parameters] for t in tools], template_kwargs or {}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def prefix_digests(context: str, messages: list[Message]) -> list[str]:
    """``out[k]`` identifies ``(context, messages[:k+1])``: a rolling hash chain."""
    out: list[str] = []
    h = context
    for m in messages:
        h = hashlib.sha256((h + message_digest(m)).encode()).hexdigest()
        out.append(h)
    return out


# --------------------------------------------------------------------------- export form


def message_to_openai(msg: Message) -> dict[str, Any]:
    """The OpenAI Chat Completions form of a message (used in exports)."""
    out: dict[str, Any] = {"role": msg.role}
    if msg.has_images:
        out["content"] = [
            {"type": "text", "text": p.text}
            if isinstance(p, TextPart)
            else {"type": "image_url", "image_url": {"url": p.url or f"data:{p.media_type};base64,{p.data}"}}
            for p in msg.content
        ]
    else:
        out["content"] = msg.text if (msg.content or msg.role != "assistant") else None
    if msg.tool_calls:
        out["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
            for tc in msg.tool_calls
        ]
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        out["name"] = msg.name
    if msg.reasoning:
        out["reasoning_content"] = msg.reasoning
    if msg.is_error:
        out["is_error"] = True
    return out


def message_from_openai(d: dict[str, Any]) -> Message:
    """Inverse of :func:`message_to_openai` (for stores and exports)."""
    content = d.get("content")
    parts: list[ContentPart] = []
    if isinstance(content, str):
        if content:
            parts.append(TextPart(content))
    elif isinstance(content, list):
        for p in content:
            if p.get("type") == "text":
                parts.append(TextPart(p.get("text", "")))
            elif p.get("type") == "image_url":
                url = p["image_url"]["url"]
                if url.startswith("data:") and ";base64," in url:
                    media, data = url[5:].split(";base64,", 1)
                    parts.append(ImagePart(data=data, media_type=media))
                else:
                    parts.append(ImagePart(url=url))
    calls = [
        ToolCall(tc.get("id", ""), tc["function"]["name"], tc["function"].get("arguments", ""))
        for tc in d.get("tool_calls") or []
    ]
    return Message(
        role=d["role"],
        content=parts,
        tool_calls=calls,
        tool_call_id=d.get("tool_call_id"),
        name=d.get("name"),
        reasoning=d.get("reasoning_content"),
        is_error=bool(d.get("is_error", False)),
    )
