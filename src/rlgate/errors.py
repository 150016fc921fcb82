"""One exception hierarchy for the gateway, one error envelope per API surface.

Exceptions (``GatewayError`` subclasses) carry an HTTP status, a message, and the
offending parameter. :func:`error_body` builds the body in the shape of the surface
that served the request:

* OpenAI (chat, responses, control routes):
  ``{"error": {"message", "type", "param", "code"}}``
* Anthropic (``/v1/messages*``): ``{"type": "error", "error": {"type", "message"}}``

Hierarchy::

    GatewayError (400 invalid_request_error)
    ├── InvalidRequest (400)
    │   └── ContextLengthExceeded (400, code context_length_exceeded)
    ├── AuthenticationFailed (401)
    ├── PermissionDenied (403)
    ├── NotFound (404)
    ├── Conflict (409)
    ├── Gone (410)
    ├── PayloadTooLarge (413)
    ├── RequestTimeout (408)
    ├── RateLimited (429)
    ├── InternalError (500, a bug: the message never says more than "internal error")
    ├── UpstreamError (502)
    └── Unavailable (503)

``retry_after`` (seconds) becomes a ``Retry-After`` header on the response.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    status: int = 400
    openai_type: str = "invalid_request_error"
    anthropic_type: str = "invalid_request_error"
    default_code: str | None = None

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int | None = None,
        retry_after: int | None = None, details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        if status is not None:
            self.status = status
        self.retry_after = retry_after
        self.details = details  # machine-readable detail clients act on (Anthropic's ``error.details``)

    @property
    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after)} if self.retry_after is not None else {}

    def message_for(self, surface: str) -> str:
        """The message in the wording of the API that serves the request (``anthropic`` / ``openai``)."""
        return self.message


class InvalidRequest(GatewayError):
    pass


class ContextLengthExceeded(InvalidRequest):
    """The prompt does not fit the context. Its message is worded as each API words it, because
    clients parse it: Claude Code matches ``prompt is too long: N tokens > M maximum`` to decide
    to compact; OpenAI clients (Codex, LangChain, the Agents SDK) key on the code
    ``context_length_exceeded``, and some on the "maximum context length is" sentence."""

    default_code = "context_length_exceeded"

    def __init__(self, message: str | None = None, *, prompt_tokens: int, limit: int,
                 param: str | None = "messages") -> None:
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        super().__init__(message or self.openai_message(), param=param)

    def openai_message(self) -> str:
        return (f"This model's maximum context length is {self.limit} tokens. However, your messages resulted in "
                f"{self.prompt_tokens} tokens. Please reduce the length of the messages.")

    def message_for(self, surface: str) -> str:
        if surface == "anthropic":
            return f"prompt is too long: {self.prompt_tokens} tokens > {self.limit} maximum"
        return self.message


class AuthenticationFailed(GatewayError):
    status = 401
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    openai_type = "permission_error"
    anthropic_type = "permission_error"
    default_code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    openai_type = "not_found_error"
    anthropic_type = "not_found_error"
    default_code = "not_found"


# The OpenAI and Anthropic SDKs retry a 409 (twice, by default) unless told not to; a session that
# ended or was interrupted stays so, and a retry only delays the agent's error.
_FINAL = {"x-should-retry": "false"}


class Conflict(GatewayError):
    status = 409
    default_code = "conflict"

    @property
    def headers(self) -> dict[str, str]:
        return {**super().headers, **_FINAL}


class Gone(GatewayError):
    status = 410
    default_code = "gone"

    @property
    def headers(self) -> dict[str, str]:
        return {**super().headers, **_FINAL}


class PayloadTooLarge(GatewayError):
    status = 413
    anthropic_type = "request_too_large"
    default_code = "request_too_large"


class RequestTimeout(GatewayError):
    status = 408
    default_code = "request_timeout"


class RateLimited(GatewayError):
    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    default_code = "rate_limited"


class InternalError(GatewayError):
    """What a client is told about an unexpected exception (it is logged, never sent)."""

    status = 500
    openai_type = "server_error"
    anthropic_type = "api_error"
    default_code = "internal_error"

    def __init__(self, message: str = "internal error; see the gateway log") -> None:
        super().__init__(message)


class UpstreamError(GatewayError):
    status = 502
    openai_type = "server_error"
    anthropic_type = "api_error"
    default_code = "upstream_error"


class Unavailable(GatewayError):
    status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"
    default_code = "unavailable"


def engine_failure(message: str, *, status: int, code: str | None) -> GatewayError:
    """The error for an engine's failure with HTTP ``status``: 503 Unavailable (overloaded),
    4xx InvalidRequest (the engine refused the request), else UpstreamError (502, 504...)."""
    if status == 503:
        return Unavailable(message, code=code)
    if 400 <= status < 500:
        return InvalidRequest(message, code=code, status=status)
    return UpstreamError(message, code=code, status=status)


def error_body(exc: GatewayError, surface: str) -> dict[str, Any]:
    message = exc.message_for(surface)
    if surface == "anthropic":
        error: dict[str, Any] = {"type": exc.anthropic_type, "message": message}
        if exc.details:
            error["details"] = exc.details
        return {"type": "error", "error": error}
    return {"error": {"message": message, "type": exc.openai_type, "param": exc.param, "code": exc.code}}


def from_status(status: int, message: str) -> GatewayError:
    """A GatewayError for a bare HTTP status (framework errors: 404 route, 405 method...)."""
    cls: type[GatewayError] = {
        401: AuthenticationFailed,
        403: PermissionDenied,
        404: NotFound,
        409: Conflict,
        410: Gone,
        408: RequestTimeout,
        413: PayloadTooLarge,
        429: RateLimited,
        500: InternalError,
        502: UpstreamError,
        503: Unavailable,
    }.get(status, InvalidRequest)
    return cls(message, status=status)
