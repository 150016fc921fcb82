"""Control routes of the policies a gateway serves (core/policies.py, docs/policies.md); admin key.

=========================  ===========================================================
route                      what
=========================  ===========================================================
GET  /rl/policies          the policies: the default first, each with its version, adapter
                           directory, active sessions and requests in flight
POST /rl/policies          load an adapter policy: ``{"name", "path", "version"?}``
POST /rl/policies/unload   unload an adapter policy: ``{"name"}`` (409 while sessions bound to it are active)
=========================  ===========================================================

New weights for a policy go through ``POST /rl/update_weights {"path", "policy"}``
(api/control/router.py), like the default policy's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from rlgate.api.auth import require_admin
from rlgate.api.control.protocol import LoadPolicyRequest, UnloadPolicyRequest
from rlgate.core.gateway import Gateway
from rlgate.engine.base import EngineError
from rlgate.errors import InvalidRequest

router = APIRouter()


def _gw(request: Request) -> Gateway:
    return request.app.state.gateway


@router.get("/rl/policies", tags=["control"])
async def list_policies(request: Request) -> dict[str, Any]:
    require_admin(request)
    g = _gw(request)
    return {"default": g.policies.default.name, "max_policies": g.config.max_policies,
            "policies": g.policies.describe()}


@router.post("/rl/policies", tags=["control"])
async def load_policy(request: Request, body: LoadPolicyRequest) -> dict[str, Any]:
    """Load a LoRA adapter directory as a new policy; sessions bind to it by name (``/rl/start_session``
    ``{"policy"}``) and requests name it in ``model``. 409 ``policy_exists`` / ``policy_limit_reached``;
    400 ``weight_update_failed`` for a directory the engine cannot serve (nothing loaded)."""
    require_admin(request)
    try:
        version = await _gw(request).policies.load(body.name, body.path, body.version)
    except EngineError as exc:
        raise InvalidRequest(exc.message, param="path", code=exc.code,
                             status=exc.status if 400 <= exc.status < 600 else 400) from exc
    return {"message": "success", "name": body.name, "version": version}


@router.post("/rl/policies/unload", tags=["control"])
async def unload_policy(request: Request, body: UnloadPolicyRequest) -> dict[str, Any]:
    """Unload an adapter policy (404 unknown; 400 the default; 409 ``policy_in_use`` while sessions bound to
    it are active). Ended sessions of it stay exportable: their turns name it."""
    require_admin(request)
    try:
        await _gw(request).policies.unload(body.name)
    except EngineError as exc:
        raise InvalidRequest(exc.message, code=exc.code, status=exc.status if 400 <= exc.status < 600 else 400) from exc
    return {"message": "success", "name": body.name}
