"""Schemas of the policies routes: a checkpoint to register, policy versions and the
events of the registry, and the shadow's comparison with the active policy."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from autotune.api.schemas.common import StrictRequest

__all__ = [
    "GoodputPair",
    "PoliciesPublic",
    "PolicyCreate",
    "PolicyEventPublic",
    "PolicyEventsPublic",
    "PolicyPublic",
    "ShadowPublic",
]


class PolicyPublic(BaseModel):
    version: str = Field(description="<kind>-<first 12 hex digits of the content hash>")
    name: str = Field(description="A person's name for it (the version when none was given)")
    kind: str
    content_hash: str | None = Field(
        default=None, description="SHA-256 of the checkpoint's content; null: no checkpoint"
    )
    checkpoint_path: str | None
    state: Literal["active", "shadow", "registered"] = Field(
        default="registered",
        description="active: it decides; shadow: it decides beside the active one, its "
        "decisions stored and never applied; registered: neither",
    )
    active: bool
    shadow: bool = False
    activated_at: datetime | None = Field(
        default=None, description="When it last became the active version"
    )
    last_error: str | None = Field(
        default=None,
        description="Why the daemon could not load it, when its newest activation or "
        "shadowing failed",
    )
    metrics: dict[str, Any]
    created_at: datetime


class PoliciesPublic(BaseModel):
    data: list[PolicyPublic]
    count: int


class PolicyCreate(StrictRequest):
    checkpoint: str = Field(
        min_length=1,
        max_length=4096,
        description="Absolute path of the checkpoint folder on the daemon's machine (an "
        "RLModule folder, or an algorithm checkpoint holding one). It is loaded, which "
        "unpickles it: register only checkpoints you trust",
    )
    name: str = Field(min_length=1, max_length=128, description="A name for people")
    kind: str = Field(
        default="ppo",
        pattern=r"^[a-z][a-z0-9_]{0,31}$",
        description="The policy family, first part of the version (ppo, bc, ...)",
    )


class PolicyEventPublic(BaseModel):
    id: int
    version: str
    action: str = Field(
        description="register, activate, rollback, shadow, unshadow, activate_failed, shadow_failed"
    )
    at: datetime
    detail: dict[str, Any] = Field(
        description="previous (the version active before, for activate and rollback), "
        "reason, by, ..."
    )


class PolicyEventsPublic(BaseModel):
    data: list[PolicyEventPublic]
    count: int


class GoodputPair(BaseModel):
    shadow: float | None = Field(description="The shadow's rounds, mean per tick")
    active: float | None = Field(description="The active policy's rounds, mean per tick")


class ShadowPublic(BaseModel):
    version: str
    name: str
    active_version: str | None = Field(description="The version it is compared with")
    since: datetime | None = Field(description="When it became the shadow")
    ticks: int = Field(description="Ticks it decided beside the active policy since then")
    agreement: float | None = Field(
        description="Share of the jobs in the active policy's slots for which both chose "
        "the same (both kept, or the same configuration), over every tick shadowed"
    )
    agreement_recent: float | None = Field(description="The same over the newest ticks")
    recent_ticks: int = Field(description="How many ticks the recent figures cover")
    predicted_goodput: GoodputPair = Field(
        description="Predicted cluster goodput after each policy's round, over every tick"
    )
    predicted_goodput_recent: GoodputPair = Field(description="The same over the newest ticks")
    decisions: int = Field(
        description="Shadow decisions stored since then (list them: GET "
        "/decisions?source=shadow&policy_version=VERSION)"
    )
