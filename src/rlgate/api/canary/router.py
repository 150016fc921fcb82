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

Without online training these answer 404; promote / rollback without a canary answer 409.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from rlgate.api.app_state import online_training
from rlgate.api.auth import require_admin
from rlgate.api.canary.protocol import CanaryActionRequest
from rlgate.errors import Conflict, NotFound
from rlgate.online.training import OnlineTraining

router = APIRouter()


def _conflict(exc: ValueError) -> Conflict:
    return Conflict(str(exc), code="no_canary")


def _training(request: Request) -> OnlineTraining:
    require_admin(request)
    training = online_training(request.app)
    if training is None:
        raise NotFound("online training is off (rlgate serve --online with a trainer)", code="online_training_off")
    return training


@router.get("/rl/online", tags=["online"])
async def state(request: Request) -> dict[str, Any]:
    return _training(request).snapshot()


@router.post("/rl/canary/pin", tags=["online"])
async def pin(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    return _training(request).canary.pin(True, (body or CanaryActionRequest()).reason).to_dict()


@router.post("/rl/canary/unpin", tags=["online"])
async def unpin(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    training = _training(request)
    decision = training.canary.pin(False, (body or CanaryActionRequest()).reason)
    if training.trainer is not None:
        training.trainer.poke()
    return decision.to_dict()


@router.post("/rl/canary/promote", tags=["online"])
async def promote(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    training = _training(request)
    try:
        return training.canary.promote("operator", (body or CanaryActionRequest()).reason).to_dict()
    except ValueError as exc:
        raise _conflict(exc) from None


@router.post("/rl/canary/rollback", tags=["online"])
async def rollback(request: Request, body: CanaryActionRequest | None = None) -> dict[str, Any]:
    training = _training(request)
    try:
        return training.canary.rollback("operator", (body or CanaryActionRequest()).reason).to_dict()
    except ValueError as exc:
        raise _conflict(exc) from None
