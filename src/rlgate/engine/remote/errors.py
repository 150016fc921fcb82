"""What can go wrong talking to a backend, and how its error bodies are read."""

from __future__ import annotations

import json
from typing import Any

import httpx

from rlgate.engine.base import EngineError, WeightUpdateError

__all__ = [
    "MAX_ERROR_BODY",
    "BackendAborted",
    "BackendFailed",
    "BackendRejected",
    "BackendUnreachable",
    "LoadRefused",
    "MalformedResponse",
    "describe_exc",
    "error_message",
    "error_text",
]

MAX_ERROR_BODY = 2000  # characters of a backend error body kept in messages


class MalformedResponse(Exception):
    """A backend answer rlgate cannot trust (mapped to a 502)."""


class BackendRejected(Exception):
    """The backend answered an event that reports an error (``{"error": ...}``)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class BackendAborted(BackendRejected):
    """The backend aborted the request (SGLang ``finish_reason.type == "abort"``, vLLM
    ``finish_reason == "abort"``). During a weight update the engine resumes it from the tokens
    already generated; otherwise it is a backend failure (503)."""

    def __init__(self, message: str, status: int | None = 503) -> None:
        super().__init__(message, status)


class BackendUnreachable(EngineError):
    """No connection to the backend could be made (nothing was sent)."""


class BackendFailed(WeightUpdateError):
    """A backend failed a step of a weight update (HTTP 502, code ``backend_error``): the server's
    fault or the connection's, not the request's."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=502, code="backend_error")


class LoadRefused(BackendFailed):
    """The backend refused a checkpoint and still serves its previous weights."""


def error_text(resp: httpx.Response) -> str:
    """The message of an error body, in any of the shapes SGLang / vLLM / FastAPI use."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:MAX_ERROR_BODY] or resp.reason_phrase
    return error_message(body) or json.dumps(body)[:MAX_ERROR_BODY]


def error_message(body: Any) -> str | None:
    """The message of a decoded error body (``{"error": {"message"}}``, ``{"detail"}``, ...), if any."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])[:MAX_ERROR_BODY]
    if isinstance(err, str):
        return err[:MAX_ERROR_BODY]
    for key in ("message", "detail"):
        if body.get(key):
            return str(body[key])[:MAX_ERROR_BODY]
    return None


def describe_exc(exc: BaseException) -> str:
    """A short description of ``exc`` for logs and error messages (httpx errors named)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.HTTPError) and type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    return text[:MAX_ERROR_BODY]
