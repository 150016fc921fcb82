"""Routes: POST /responses and /v1/responses (session key)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from rlgate.api.auth import session_from_request
from rlgate.api.common import JsonResponse, parse_model, read_json, report_ignored, retry_attempt, template_dropped
from rlgate.api.openai_responses import convert, objects, serving
from rlgate.api.openai_responses.protocol import ResponseCreateRequest
from rlgate.api.openai_responses.tools import response_tools
from rlgate.api.openapi import body_schema
from rlgate.errors import ContextLengthExceeded

router = APIRouter()
BODY_MODELS = [ResponseCreateRequest]  # documented in the OpenAPI schema


@router.post("/responses", openapi_extra=body_schema(ResponseCreateRequest), tags=["openai"])
@router.post("/v1/responses", openapi_extra=body_schema(ResponseCreateRequest), tags=["openai"])
async def create_response(request: Request):
    gw = request.app.state.gateway
    session = session_from_request(request)
    body = parse_model(ResponseCreateRequest, await read_json(request))
    tools = response_tools(body.tools)
    chat = convert.to_chat_request(body, session, tools)
    chat.retry_attempt, chat.model = retry_attempt(request), body.model
    headers = report_ignored("responses", convert.ignored_params(body, tools))
    ctx = objects.context(body, chat, body.model or gw.config.model_name, tools)
    try:
        prepared = await gw.generation.prepare(session, chat, api="responses", id_prefix=serving.ID_PREFIX,
                                               call_id=serving.new_call_id)
    except ContextLengthExceeded as exc:
        if not body.stream:
            raise
        return StreamingResponse(serving.failed_stream(ctx, exc), media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})
    headers |= template_dropped(prepared.interaction.template_dropped)
    if body.stream:
        return StreamingResponse(
            serving.stream_events(gw.generation, prepared, ctx),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    return JsonResponse(await serving.complete(gw.generation, prepared, ctx), headers=headers)
