"""One place that maps every exception to a status and a body in the surface's error shape."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlgate.api.common import JsonResponse, describe_errors
from rlgate.core.request_scope import store_refusal
from rlgate.errors import GatewayError, InternalError, InvalidRequest, error_body, from_status
from rlgate.store.base import StoreError
from rlgate.surfaces import error_shape, is_api_path

log = logging.getLogger("rlgate.server")


def _error_response(request: Request, exc: GatewayError, headers: Mapping[str, str] | None = None) -> JsonResponse:
    return JsonResponse(error_body(exc, error_shape(request.url.path)), status_code=exc.status,
                        headers={**exc.headers, **(headers or {})})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JsonResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JsonResponse:
        errs = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errs):  # not JSON at all: as the API surfaces say it
            return _error_response(request, InvalidRequest(
                f"the request body is not valid JSON: {errs[0].get('msg')}", code="invalid_json"))
        msg, loc = describe_errors(errs, {"body": exc.body}, skip=("body",))
        # API surfaces answer 400 (as OpenAI / Anthropic do); control routes 422 (as the original).
        status = 400 if is_api_path(request.url.path) else 422
        return _error_response(request, InvalidRequest(msg, param=loc, status=status))

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JsonResponse:
        # a write refused at submission: nothing of the request stays in memory
        return _error_response(request, store_refusal(exc, f"{request.method} {request.url.path}"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JsonResponse:
        return _error_response(request, from_status(exc.status_code, str(exc.detail)), headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JsonResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error_response(request, InternalError())
