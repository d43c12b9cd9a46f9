"""Schemas of the health routes: liveness, readiness, the decision loop's health and
the leader lease."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

__all__ = ["Health", "LeaderPublic", "Readiness", "TickHealthPublic"]


class Health(BaseModel):
    status: str = "ok"
    version: str


class TickHealthPublic(BaseModel):
    ok: bool = Field(description="The last tick succeeded and the daemon's own policy decided")
    consecutive_failures: int = Field(description="Failed ticks in a row")
    failures_total: int = Field(description="Failed ticks since the daemon started")
    last_error: str | None = Field(description="Type: message of the newest failure")
    last_failure_at: datetime | None
    fallback: bool = Field(description="Deciding with the fallback policy")
    fallback_policy: str | None = Field(description="Its name, while it decides")
    paused: str | None = Field(
        default=None,
        description="Why ticks are paused (the database cannot take them, or the leader "
        "lease was not renewed); null: they are not",
    )
    paused_since: datetime | None = None


class LeaderPublic(BaseModel):
    """Which daemon decides, when several share the database (the leader lease)."""

    daemon: str = Field(description="This daemon (host:pid:random)")
    leading: bool = Field(description="This daemon holds the lease and decides")
    term: int | None = Field(description="The term this daemon leads in; null: it follows")
    leader: str | None = Field(description="The lease's holder as last read")
    leader_term: int | None = Field(description="The lease's term as last read")
    lease_expires_in_s: float | None = Field(
        description="Seconds until the lease expires unless renewed (negative: expired)"
    )
    error: str | None = Field(description="Why the lease could not be read or renewed")


class Readiness(BaseModel):
    status: str
    database: bool
    policy_version: str | None
    tick: TickHealthPublic | None = Field(
        default=None, description="The decision loop's health (null: no daemon in this process)"
    )
    leader: LeaderPublic | None = Field(
        default=None, description="Leadership among the daemons sharing the database"
    )
    reasons: list[str] = Field(default_factory=list, description="Why not ready, in words")
