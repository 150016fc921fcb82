"""Routes: POST /v1/messages and /v1/messages/count_tokens (session key: x-api-key or Bearer)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from rlgate.api.anthropic import serving
from rlgate.api.anthropic.protocol import CountTokensRequest, MessageCreateRequest
from rlgate.api.auth import session_from_request
from rlgate.api.common import JsonResponse, parse_model, read_json, report_ignored, retry_attempt, template_dropped
from rlgate.api.openapi import body_schema

router = APIRouter()
BODY_MODELS = [MessageCreateRequest, CountTokensRequest]  # documented in the OpenAPI schema


@router.post("/v1/messages", openapi_extra=body_schema(MessageCreateRequest), tags=["anthropic"])
async def create_message(request: Request):
    gw = request.app.state.gateway
    session = session_from_request(request)
    body = parse_model(MessageCreateRequest, await read_json(request))
    chat = serving.to_chat_request(body)
    chat.retry_attempt, chat.model = retry_attempt(request), body.model
    headers = report_ignored("messages", serving.ignored_params(body))
    prepared = await gw.generation.prepare(session, chat, api="messages", id_prefix=serving.ID_PREFIX,
                                     call_id=serving.tool_use_id)
    headers |= template_dropped(prepared.interaction.template_dropped)
    model = body.model or gw.config.model_name
    if body.stream:
        return StreamingResponse(
            serving.stream_events(gw.generation, prepared, model),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    return JsonResponse(await serving.complete(gw.generation, prepared, model), headers=headers)


@router.post("/v1/messages/count_tokens", openapi_extra=body_schema(CountTokensRequest), tags=["anthropic"])
async def count_tokens(request: Request):
    """The prompt length a /v1/messages call with this body would send; records nothing."""
    gw = request.app.state.gateway
    session = session_from_request(request)
    body = parse_model(CountTokensRequest, await read_json(request))
    chat = serving.to_chat_request(body)
    headers = report_ignored("messages.count_tokens", serving.ignored_params(body))
    gw.sessions.require_active(session)  # an ended or interrupted key counts nothing (409 / 410)
    built = await gw.generation.build_prompt(session, chat)  # side-effect free: nothing is registered
    return JsonResponse({"input_tokens": len(built.prompt_ids)},
                        headers={**headers, **template_dropped(built.interaction.template_dropped)})
