"""Schemas of the decisions routes: a decision, a page of them, and the explanation of
one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from autotune.api.schemas.common import Paged
from autotune.core import DecisionSource

__all__ = ["DecisionExplanation", "DecisionPublic", "DecisionsPublic"]


class DecisionPublic(BaseModel):
    id: int
    job_id: str
    source: DecisionSource
    policy_version: str
    decided_at: datetime
    applied_at: datetime | None = Field(description="null: committed, not yet applied")
    reason: str
    config: dict[str, Any]
    placement: dict[str, Any] | None
    override_id: int | None = Field(default=None, description="The override it honours")
    preempt: bool = Field(
        default=False,
        description="The job was stopped (after a checkpoint) to wait again; placement null",
    )


class DecisionsPublic(Paged):
    data: list[DecisionPublic]


class DecisionExplanation(BaseModel):
    decision_id: int
    job_id: str
    source: DecisionSource
    override_id: int | None
    features: dict[str, float] = Field(description="Observation features that mattered")
    chosen: dict[str, Any] = Field(description="The configuration and its predicted goodput")
    alternatives: list[dict[str, Any]] = Field(
        description="Neighbouring configurations on the same GPUs, by predicted goodput"
    )
    why: str
