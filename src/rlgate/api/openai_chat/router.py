"""Routes: POST /chat/completions and /v1/chat/completions (session key)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from rlgate.api.auth import session_from_request
from rlgate.api.common import JsonResponse, parse_model, read_json, report_ignored, retry_attempt, template_dropped
from rlgate.api.openai_chat import serving
from rlgate.api.openai_chat.protocol import ChatCompletionRequest
from rlgate.api.openapi import body_schema

router = APIRouter()
BODY_MODELS = [ChatCompletionRequest]  # documented in the OpenAPI schema


@router.post("/chat/completions", openapi_extra=body_schema(ChatCompletionRequest), tags=["openai"])
@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest), tags=["openai"])
async def chat_completions(request: Request):
    gw = request.app.state.gateway
    session = session_from_request(request)
    body = parse_model(ChatCompletionRequest, await read_json(request))
    chat = serving.to_chat_request(body)
    chat.retry_attempt, chat.model = retry_attempt(request), body.model
    headers = report_ignored("chat.completions", serving.ignored_params(body))
    prepared = await gw.generation.prepare(session, chat, api="chat", id_prefix=serving.ID_PREFIX)
    headers |= template_dropped(prepared.interaction.template_dropped)
    model = body.model or gw.config.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            serving.stream_chunks(gw.generation, prepared, model, include_usage),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    return JsonResponse(await serving.complete(gw.generation, prepared, model), headers=headers)
