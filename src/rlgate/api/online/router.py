"""Online routes (``rlgate serve --online``; docs/online.md).

=========================  ===========  =================================================
route                      key          what
=========================  ===========  =================================================
POST /v1/tenants           admin        new tenant + its API key (shown once)
GET  /v1/tenants           admin        tenants (never keys)
POST /v1/tenants/revoke    admin        revoke a tenant's key (optionally delete its data)
POST /v1/feedback          tenant/adm   feedback on a turn or a conversation
GET  /v1/feedback          tenant/adm   stored feedback, oldest first, after a cursor
POST /v1/data/delete       tenant/adm   delete a conversation or all of a tenant's data
=========================  ===========  =================================================

A tenant key reaches only its own tenant's data; the early gate (``server/auth_gate.py``)
refuses a missing, unknown or misplaced key before a body is read.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from rlgate.api.app_state import online_state
from rlgate.api.auth import is_admin_request, tenant_from_request
from rlgate.api.online.protocol import CreateTenantRequest, DeleteDataRequest, FeedbackRequest, RevokeTenantRequest
from rlgate.errors import AuthenticationFailed, InvalidRequest, NotFound, PermissionDenied
from rlgate.online.service import OnlineGateway
from rlgate.records.tenants import Tenant

router = APIRouter()


def online(request: Request) -> OnlineGateway:
    state = online_state(request.app)
    assert state is not None  # these routes are mounted only in the online mode
    return state


def caller(request: Request) -> Tenant | None:
    """The calling tenant; None for the admin key; 401 for anything else."""
    tenant = tenant_from_request(request)
    if tenant is not None:
        return tenant
    if is_admin_request(request):
        return None
    raise AuthenticationFailed("this route needs a tenant key or the admin key")


def admin_only(request: Request) -> None:
    if caller(request) is not None:
        raise PermissionDenied("this route needs the admin key")


def whose(request: Request, tenant_id: str | None) -> str | None:
    """The tenant a request acts for: the caller's own, or the one an admin names (None: all)."""
    me = caller(request)
    if me is None:
        if tenant_id is not None:
            online(request).tenant(tenant_id)  # 404 for an unknown tenant
        return tenant_id
    if tenant_id is not None and tenant_id != me.id:
        raise PermissionDenied("a tenant key reaches only its own tenant's data")
    return me.id


def tenant_view(t: Tenant) -> dict[str, Any]:
    return {"id": t.id, "name": t.name, "created_at": t.created_at, "revoked_at": t.revoked_at}


@router.post("/v1/tenants", tags=["online"])
async def create_tenant(request: Request, body: CreateTenantRequest) -> dict[str, Any]:
    admin_only(request)
    tenant, key = online(request).create_tenant(body.name)
    return {**tenant_view(tenant), "api_key": key}


@router.get("/v1/tenants", tags=["online"])
async def list_tenants(request: Request) -> dict[str, Any]:
    admin_only(request)
    return {"object": "list", "data": [tenant_view(t) for t in online(request).tenants.tenants.values()]}


@router.post("/v1/tenants/revoke", tags=["online"])
async def revoke_tenant(request: Request, body: RevokeTenantRequest) -> dict[str, Any]:
    admin_only(request)
    on = online(request)
    tenant = on.revoke_tenant(body.tenant_id)
    deleted = None
    if body.delete_data:
        deleted = asdict(on.rights.delete_tenant_data(tenant.id))
        on.forget_tenant(tenant.id)
        await on.records.forget_deleted()  # durable, and gone from the store's files, before the 200
    return {**tenant_view(tenant), "deleted": deleted}


@router.post("/v1/feedback", tags=["online"])
async def post_feedback(request: Request, body: FeedbackRequest) -> dict[str, Any]:
    on = online(request)
    tenant = whose(request, body.tenant_id)
    target = on.target(tenant, body.interaction_id, body.conversation_id)
    other = None
    if body.other_interaction_id is not None:
        if body.kind != "preference":
            raise InvalidRequest("other_interaction_id belongs to a preference", param="other_interaction_id")
        found = on.conversations.find_turn(target.tenant, body.other_interaction_id)
        if found is None or not found[1].completed:
            raise NotFound(f"turn {body.other_interaction_id!r} not found", param="other_interaction_id")
        other = found
    events, reward = on.record(target, body.kind, body.value, body.source, metadata=body.metadata, other=other)
    return {"object": "feedback", "ids": [e.id for e in events], "tenant_id": target.tenant,
            "conversation_id": target.conversation_id, "interaction_id": events[0].interaction_id,
            "reward": reward}


@router.get("/v1/feedback", tags=["online"])
async def list_feedback(request: Request, conversation_id: str | None = None, interaction_id: str | None = None,
                        tenant_id: str | None = None, after: int = 0, limit: int = 100) -> dict[str, Any]:
    if not 1 <= limit <= 1000 or after < 0:
        raise InvalidRequest("limit is 1-1000 and after >= 0", param="limit")
    tenant = whose(request, tenant_id)
    page = online(request).list_feedback(tenant, conversation_id=conversation_id, interaction_id=interaction_id,
                                         after=after, limit=limit)
    return {"object": "list", "data": [asdict(e) for e in page.events], "cursor": page.cursor}


@router.post("/v1/data/delete", tags=["online"])
async def delete_data(request: Request, body: DeleteDataRequest) -> dict[str, Any]:
    on = online(request)
    tenant = whose(request, body.tenant_id)
    if tenant is None:
        raise InvalidRequest("with the admin key, name the tenant (tenant_id)", param="tenant_id")
    if body.all == (body.conversation_id is not None):
        raise InvalidRequest("name one conversation (conversation_id) or all of the tenant's data (all: true)",
                             param="conversation_id")
    if body.conversation_id is not None:
        if not on.conversations.turns_of(tenant, body.conversation_id) and not on.records.count_feedback(
                tenant=tenant, conversation_id=body.conversation_id):
            raise NotFound(f"conversation {body.conversation_id!r} not found", param="conversation_id")
        deletion = on.rights.delete_conversation(tenant, body.conversation_id)
    else:
        deletion = on.rights.delete_tenant_data(tenant)
    await on.records.forget_deleted()  # durable, and gone from the store's files (the WAL), before the 200
    return {"object": "deletion", **asdict(deletion)}
