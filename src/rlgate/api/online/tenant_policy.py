"""Which policy serves each tenant (``rlgate serve --online``; online/tenant_policies.py, docs/policies.md).

=============================  =====  ======================================================
route                          key    what
=============================  =====  ======================================================
POST /v1/tenants/policy        admin  ``{"tenant_id", "policy"}``: the tenant's next sessions are
                                      served by that policy (null: the default policy)
GET  /v1/tenants/policies      admin  ``{"default", "tenants": {tenant id: policy}}``
=============================  =====  ======================================================
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from rlgate.api.online.router import admin_only, online
from rlgate.online.tenant_policies import TenantPolicies

router = APIRouter()


class TenantPolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: str = Field(min_length=1, max_length=64)
    policy: str | None = Field(max_length=64)  # null: the default policy


def _policies(request: Request) -> TenantPolicies:
    return request.app.state.tenant_policies


@router.post("/v1/tenants/policy", tags=["online"])
async def bind_tenant(request: Request, body: TenantPolicyRequest) -> dict[str, Any]:
    """404 for an unknown tenant or policy."""
    admin_only(request)
    online(request).tenant(body.tenant_id)  # 404 for an unknown tenant
    policies = _policies(request)
    policies.bind(body.tenant_id, body.policy)
    return {"tenant_id": body.tenant_id, "policy": policies.policy_of(body.tenant_id)}


@router.get("/v1/tenants/policies", tags=["online"])
async def tenant_policies(request: Request) -> dict[str, Any]:
    admin_only(request)
    policies = _policies(request)
    return {"default": policies.policies.default.name, "tenants": policies.bindings()}
