"""Wire models of the control routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, FiniteFloat

from rlgate.trajectory.export import DEFAULT_EXPORT_STYLE


class GrantCapacityRequest(BaseModel):
    count: int = Field(default=1, ge=1, le=1_000_000)


class StartSessionRequest(BaseModel):
    task_id: str = Field(min_length=1, max_length=256)
    api_key: str | None = Field(default=None, max_length=512)
    mode: Literal["token_exact", "rerender"] | None = None  # per-session trajectory mode
    metadata: dict[str, Any] | None = None
    policy: str | None = Field(default=None, max_length=64)  # bind the session to this policy (GET /v1/models)


class StartSessionsRequest(BaseModel):
    """Several ``/rl/start_session`` bodies in one call (rlgate extension)."""

    sessions: list[StartSessionRequest] = Field(min_length=1, max_length=1024)


class SetRewardRequest(BaseModel):
    reward: float = Field(allow_inf_nan=False)
    interaction_id: str | None = None
    session_id: str | None = None  # admin key only: which session


class ExportRequest(BaseModel):
    session_id: str
    discount: float = Field(default=1.0, ge=0.0, le=1.0)
    style: Literal["individual", "concat"] = DEFAULT_EXPORT_STYLE
    keep: bool = False  # leave the session in place (export again later)
    wait_timeout: float = Field(default=0.0, ge=0.0, le=3600.0)  # seconds to wait for the session to end


class FinishSessionRequest(BaseModel):
    """End an active session, reward it and export it, in one call (rlgate extension)."""

    session_id: str
    reward: float | None = Field(default=None, allow_inf_nan=False)  # for the last completed interaction
    rewards: dict[str, FiniteFloat] | None = None  # interaction id -> reward
    discount: float = Field(default=1.0, ge=0.0, le=1.0)
    style: Literal["individual", "concat"] = DEFAULT_EXPORT_STYLE
    wait_timeout: float = Field(default=0.0, ge=0.0, le=3600.0)  # seconds to wait for requests in flight


class UpdateWeightsRequest(BaseModel):
    path: str = Field(min_length=1)
    policy: str | None = Field(default=None, max_length=64)  # an adapter policy: path is its adapter directory


class LoadPolicyRequest(BaseModel):
    """``POST /rl/policies``: a new adapter policy."""

    name: str = Field(min_length=1, max_length=64)
    path: str = Field(min_length=1)  # a PEFT LoRA adapter directory (adapter_config.json + *.safetensors)
    version: int | None = Field(default=None, ge=0, le=2**31 - 1)  # its version (default 0; a resumed run's)


class UnloadPolicyRequest(BaseModel):
    name: str = Field(min_length=1, max_length=64)


class CollectRequest(BaseModel):
    max_sessions: int = Field(default=16, ge=1, le=1000)  # at most this many exports in one answer
    wait_timeout: float = Field(default=0.0, ge=0.0, le=10.0)  # seconds to wait for the first finished session
    style: Literal["individual", "concat"] = DEFAULT_EXPORT_STYLE
    discount: float = Field(default=1.0, ge=0.0, le=1.0)
    policy: str | None = Field(default=None, max_length=64)  # only sessions of this policy (unbound: the default's)
