"""Canary routes (``rlgate serve --online`` with online training; docs/online.md, "Canary rollout").

=========================  ===========  ==========================================
route                      key          what
=========================  ===========  ==========================================
GET  /rl/online            admin        canary, trainer, live groups, feedback tail
POST /rl/canary/pin        admin        no automatic decision; new conversations on stable
POST /rl/canary/unpin      admin        automatic decisions again
POST /rl/canary/promote    admin        the canary becomes stable now
POST /rl/canary/rollback   admin        the canary is dropped now
=========================  ===========  ==========================================

Without online training these answer 404; promote / rollback without a canary answer 409. With adapter
policies learning online (``--online-train-adapters``), each has its own canary: the actions name it in
``"policy"`` (400 ``policy_required`` without, 404 ``policy_not_found`` for one that does not learn here) and
``GET /rl/online`` lists every learner (``?policy=NAME``: one).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from rlgate.api.app_state import online_learners, online_training
from rlgate.api.auth import require_admin
from rlgate.api.canary.protocol import CanaryActionRequest
from rlgate.errors import Conflict, NotFound
from rlgate.online.training import OnlineTraining

router = APIRouter()


def _conflict(exc: ValueError) -> Conflict:
    return Conflict(str(exc), code="no_canary")


def _training(request: Request, body: CanaryActionRequest | None = None) -> OnlineTraining:
    require_admin(request)
    learners = online_learners(request.app)
    if learners is not None:
        return learners.get(body.policy if body is not None else None)
    training = online_training(request.app)
    if training is None:
        raise NotFound("online training is off (rlgate serve --online with a trainer)", code="online_training_off")
    if body is not None and body.policy is not None:
        raise NotFound("only the default policy learns online here (--online-train); adapter policies learn with "
                       "--online-train-adapters", param="policy", code="policy_not_found")
    return training


@router.get("/rl/online", tags=["online"])
async def state(request: Request, policy: str | None = None) -> dict[str, Any]:
    require_admin(request)
    learners = online_learners(request.app)
    if learners is not None and policy is None:
        return learners.snapshot()
    return _training(request, CanaryActionRequest.model_construct(policy=policy) if policy is not None else None).snapshot()


@router.post("/rl/canary/pin", tags=["online"])
async def pin(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    return _training(request, body).canary.pin(True, (body or CanaryActionRequest()).reason).to_dict()


@router.post("/rl/canary/unpin", tags=["online"])
async def unpin(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    training = _training(request, body)
    decision = training.canary.pin(False, (body or CanaryActionRequest()).reason)
    if training.trainer is not None:
        training.trainer.poke()
    return decision.to_dict()


@router.post("/rl/canary/promote", tags=["online"])
async def promote(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    training = _training(request, body)
    try:
        return training.canary.promote("operator", (body or CanaryActionRequest()).reason).to_dict()
    except ValueError as exc:
        raise _conflict(exc) from None


@router.post("/rl/canary/rollback", tags=["online"])
async def rollback(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    training = _training(request, body)
    try:
        return training.canary.rollback("operator", (body or CanaryActionRequest()).reason).to_dict()
    except ValueError as exc:
        raise _conflict(exc) from None
