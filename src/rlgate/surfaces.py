"""The three API surfaces, known in one place: their paths, their error shape and the frames
that end one of their streams with an error.

The gateway's routes, its error handlers and ASGI middleware, and the cluster router all ask
this module, so a surface's error looks the same whichever of them answers (issue 23: the
router had its own copy of the Responses stream error, which dropped ``response.failed`` and
restarted ``sequence_number`` at 0).

=============  ==============================================  ===========  ==========================
surface        paths (a leading ``/v1`` is optional for OpenAI)  error shape  stream error
=============  ==============================================  ===========  ==========================
``chat``       ``/v1/chat/completions``                        OpenAI       ``data: {"error": ...}``
``responses``  ``/v1/responses``                               OpenAI       ``error`` +
                                                                            ``response.failed`` events
``messages``   ``/v1/messages``, ``/v1/messages/count_tokens``  Anthropic    ``event: error``
=============  ==============================================  ===========  ==========================

Every other path (control routes, the viewer) answers in the OpenAI shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.errors import ContextLengthExceeded, GatewayError, error_body
from rlgate.json_text import dumps

__all__ = ["SURFACES", "ResponsesStream", "Surface", "error_shape", "find_last_seq", "is_api_path", "responses_failure_code",
           "sse_frame", "surface_for"]

ErrorShape = Literal["openai", "anthropic"]


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``event: NAME`` (when given) and one ``data:`` line of compact JSON."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + dumps(data) + b"\n\n"


@dataclass
class ResponsesStream:
    """What a Responses stream's error frames need to carry on where the stream stopped: the
    response object as last announced (``response.created`` / ``in_progress``) and the next
    ``sequence_number``."""

    response: dict[str, Any] | None = None
    next_seq: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)  # output items completed so far

    def event(self, kind: str, fields: dict[str, Any]) -> bytes:
        frame = sse_frame({"type": kind, "sequence_number": self.next_seq, **fields}, event=kind)
        self.next_seq += 1
        return frame


def responses_failure_code(exc: GatewayError) -> str:
    """``response.failed``'s ``error.code``: what Codex and the SDKs act on."""
    if isinstance(exc, ContextLengthExceeded):
        return exc.code or "context_length_exceeded"
    return "rate_limit_exceeded" if exc.status == 429 else "server_error"


@dataclass(frozen=True)
class Surface:
    name: str
    paths: tuple[str, ...]
    shape: ErrorShape

    def error_body(self, exc: GatewayError) -> dict[str, Any]:
        return error_body(exc, self.shape)

    def stream_error_frames(self, exc: GatewayError, state: ResponsesStream | None = None) -> list[bytes]:
        """The frames that report ``exc`` inside this surface's stream; the stream ends after them."""
        if self.name == "messages":
            return [sse_frame(self.error_body(exc), event="error")]
        if self.name == "responses":
            st = state or ResponsesStream()
            frames = [st.event("error", {"code": exc.code or exc.openai_type, "message": exc.message,
                                         "param": exc.param})]
            if st.response is not None:
                failed = {**st.response, "status": "failed", "completed_at": None, "output": list(st.output),
                          "error": {"code": responses_failure_code(exc), "message": exc.message}}
                frames.append(st.event("response.failed", {"response": failed}))
            return frames
        return [sse_frame(self.error_body(exc))]


CHAT = Surface("chat", ("/v1/chat/completions", "/chat/completions"), "openai")
RESPONSES = Surface("responses", ("/v1/responses", "/responses"), "openai")
MESSAGES = Surface("messages", ("/v1/messages", "/v1/messages/count_tokens"), "anthropic")
SURFACES: tuple[Surface, ...] = (CHAT, RESPONSES, MESSAGES)
_BY_PATH = {p: s for s in SURFACES for p in s.paths}
_ANTHROPIC_PREFIX = "/v1/messages"


def surface_for(path: str) -> Surface | None:
    """The surface a request path belongs to (None: a control or viewer route)."""
    return _BY_PATH.get(path)


def error_shape(path: str) -> ErrorShape:
    """The error body shape for any path: Anthropic's under ``/v1/messages``, else OpenAI's."""
    return "anthropic" if path.startswith(_ANTHROPIC_PREFIX) else "openai"


def is_api_path(path: str) -> bool:
    """An API surface's path (or another ``/v1/...`` route): validation errors answer 400 there,
    as OpenAI and Anthropic do; control routes answer 422."""
    return path in _BY_PATH or path.startswith("/v1/")


def find_last_seq(chunk: bytes) -> int | None:
    """The last ``"sequence_number":N`` in a chunk of a Responses stream (None: none in it)."""
    at = chunk.rfind(b'"sequence_number":')
    if at < 0:
        return None
    digits = bytearray()
    for b in chunk[at + 18:at + 40]:
        if 48 <= b <= 57:
            digits.append(b)
        elif digits or b not in b" ":
            break
    return int(digits) if digits else None
