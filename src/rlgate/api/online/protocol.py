"""Wire models of the online routes (docs/online.md, "HTTP API")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class CreateTenantRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)


class RevokeTenantRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: str = Field(min_length=1, max_length=64)
    delete_data: bool = False  # also delete everything the tenant's conversations left, and the tenant


class FeedbackRequest(BaseModel):
    """Feedback on a turn (``interaction_id``: the id of the response the client got) or on a
    conversation (``conversation_id`` alone)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["thumbs", "rating", "preference", "comment", "outcome"]
    value: bool | float | str  # by kind: docs/online.md (thumbs true / false or 1 / -1, rating 1-5, ...)
    interaction_id: str | None = Field(default=None, min_length=1, max_length=256)
    conversation_id: str | None = Field(default=None, min_length=1, max_length=256)
    other_interaction_id: str | None = Field(default=None, min_length=1, max_length=256)  # preference: the other reply
    source: Literal["explicit", "delayed"] = "explicit"  # delayed: an outcome known later (e.g. "the PR was merged")
    metadata: dict[str, Any] | None = None
    tenant_id: str | None = Field(default=None, max_length=64)  # admin key only: whose conversation


class DeleteDataRequest(BaseModel):
    """Delete one conversation (``conversation_id``) or all of a tenant's data (``all``)."""

    model_config = ConfigDict(extra="forbid")
    conversation_id: str | None = Field(default=None, min_length=1, max_length=256)
    all: bool = False
    tenant_id: str | None = Field(default=None, max_length=64)  # admin key only (a tenant key names itself)
