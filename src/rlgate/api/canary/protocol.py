"""Wire models of the canary routes."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CanaryActionRequest(BaseModel):
    reason: str = Field(default="operator", min_length=1, max_length=1000)  # logged and kept with the decision
    # the adapter policy whose canary is meant (--online-train-adapters: each policy has its own; docs/policies.md)
    policy: str | None = Field(default=None, min_length=1, max_length=64)
