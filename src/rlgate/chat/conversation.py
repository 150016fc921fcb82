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

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.json_text import canonical

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


def _plain_text(msg: Message) -> str | None:
    """The message's text if its content is text only, else None."""
    c = msg.content
    if not c:
        return ""
    if len(c) == 1 and type(c[0]) is TextPart:
        return c[0].text
    if all(type(p) is TextPart for p in c):
        return "".join(p.text for p in c)  # type: ignore[union-attr]
    return None


@functools.lru_cache(maxsize=65536)
def _canonical_arguments(raw: str) -> str:
    try:
        return canonical_json(json.loads(raw)) if raw.strip() else "{}"
    except (json.JSONDecodeError, ValueError):
        return json.dumps(raw)


def _message_bytes(msg: Message, text: str | None) -> bytes:
    """Canonical bytes of a message (same equivalence as :func:`canonical_message`)."""
    if text is None:  # images: the generic canonical form
        return b"j" + canonical_json(canonical_message(msg)).encode("utf-8", "surrogatepass")
    if msg.role == "assistant":
        text = text.strip()
    out = [b"t", msg.role.encode(), b"\x1f", text.encode("utf-8", "surrogatepass")]
    for tc in msg.tool_calls:
        out += [b"\x1e", tc.name.encode("utf-8", "surrogatepass"), b"\x1f",
                _canonical_arguments(tc.arguments).encode("utf-8", "surrogatepass")]
    if msg.role == "tool" and msg.is_error:
        out.append(b"\x1eE")
    return b"".join(out)


class DigestChain:
    """A rolling digest over a context key and a sequence of canonical messages.

    ``add(m)`` feeds one message; ``hexdigest()`` identifies everything fed so far and
    does not end the chain (hashlib digests leave the state usable). Every request
    re-sends its whole history, so this runs once per message per request: with a
    ``memo`` (one per session) a message seen before costs a dict lookup instead of
    hashing its content again (~0.5 µs instead of ~2 µs).
    """

    __slots__ = ("_h", "_memo")

    def __init__(self, context: str = "", memo: dict[Any, bytes] | None = None) -> None:
        self._h = hashlib.blake2b(context.encode(), digest_size=16)
        self._memo = memo

    def add(self, msg: Message) -> DigestChain:
        text = _plain_text(msg)
        key = None
        if self._memo is not None and text is not None:
            key = (msg.role, text, msg.is_error, tuple((tc.name, tc.arguments) for tc in msg.tool_calls))
            digest = self._memo.get(key)
            if digest is not None:
                self._h.update(digest)
                return self
        digest = hashlib.blake2b(_message_bytes(msg, text), digest_size=16).digest()
        if key is not None:
            if len(self._memo) >= 200_000:  # type: ignore[arg-type]
                self._memo.clear()  # type: ignore[union-attr]
            self._memo[key] = digest  # type: ignore[index]
        self._h.update(digest)
        return self

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def copy(self) -> DigestChain:
        out = DigestChain.__new__(DigestChain)
        out._h = self._h.copy()
        out._memo = self._memo
        return out


def tools_digest(tools: list[ToolSpec], template_kwargs: dict[str, Any] | None = None) -> tuple[str, int]:
    """Digest of everything besides the messages that changes the rendering, and the length of
    its canonical JSON (how much text the tools and kwargs are: what rendering them costs)."""
    if not tools and not template_kwargs:
        return _NO_TOOLS_DIGEST, 0  # the common case, computed once
    payload = [[t.name, t.description, t.parameters] for t in tools], template_kwargs or {}
    data = canonical(payload)  # orjson: every request of a tool-using agent sends its tools again
    return hashlib.blake2b(data, digest_size=16).hexdigest(), len(data)


_NO_TOOLS_DIGEST = hashlib.blake2b(canonical([[], {}]), digest_size=16).hexdigest()


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
