"""Overrides: a person's pins on a job's configuration until they expire. Deleting one
ends it (the row stays: decisions refer to it); a job's newest override wins."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from autotune.core import utc_now
from autotune.db.tables import JobRow, OverrideRow

__all__ = [
    "OverrideRecord",
    "active_overrides",
    "create_override",
    "delete_override",
    "get_override",
    "list_overrides",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class OverrideRecord:
    override_id: int
    job_id: str
    pin: dict[str, Any]
    reason: str
    created_at: datetime
    expires_at: datetime
    deleted_at: datetime | None

    def active_at(self, when: datetime) -> bool:
        return self.deleted_at is None and self.expires_at > when


def _override_record(row: OverrideRow) -> OverrideRecord:
    return OverrideRecord(
        override_id=row.id,
        job_id=row.job_id,
        pin=row.pin,
        reason=row.reason,
        created_at=row.created_at,
        expires_at=row.expires_at,
        deleted_at=row.deleted_at,
    )


def create_override(
    *,
    session: Session,
    job_id: str,
    pin: dict[str, Any],
    reason: str,
    expires_at: datetime,
    at: datetime | None = None,
) -> OverrideRecord:
    """Store an override; an active override of the same job is ended now (the newest
    one wins). ``at``: when (default now)."""
    now = at or utc_now()
    for other in session.scalars(
        select(OverrideRow).where(
            OverrideRow.job_id == job_id,
            OverrideRow.deleted_at.is_(None),
            OverrideRow.expires_at > now,
        )
    ):
        other.deleted_at = now
    row = OverrideRow(job_id=job_id, pin=pin, reason=reason, created_at=now, expires_at=expires_at)
    session.add(row)
    session.flush()
    return _override_record(row)


def get_override(*, session: Session, override_id: int) -> OverrideRecord | None:
    row = session.get(OverrideRow, override_id)
    return None if row is None else _override_record(row)


def delete_override(
    *, session: Session, override_id: int, at: datetime | None = None
) -> OverrideRecord | None:
    """End an override now, or ``at`` (kept in the table: decisions refer to it)."""
    row = session.get(OverrideRow, override_id)
    if row is None:
        return None
    if row.deleted_at is None:
        row.deleted_at = at or utc_now()
    return _override_record(row)


def list_overrides(
    *,
    session: Session,
    job_id: str | None = None,
    active_at: datetime | None = None,
    ended_at: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
    tenant: str | None = None,
) -> tuple[list[OverrideRecord], int]:
    """Overrides newest first (only those active at ``active_at``, or only those that
    had ended by ``ended_at``, or only those on ``tenant``'s jobs, when given)."""
    query = select(OverrideRow)
    if job_id is not None:
        query = query.where(OverrideRow.job_id == job_id)
    if tenant is not None:
        query = query.where(
            OverrideRow.job_id.in_(select(JobRow.job_id).where(JobRow.tenant == tenant))
        )
    if active_at is not None:
        query = query.where(OverrideRow.deleted_at.is_(None), OverrideRow.expires_at > active_at)
    if ended_at is not None:
        query = query.where(
            or_(OverrideRow.deleted_at.is_not(None), OverrideRow.expires_at <= ended_at)
        )
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(OverrideRow.id.desc()).limit(limit).offset(offset))
    return [_override_record(r) for r in rows], total


def active_overrides(*, session: Session, at: datetime) -> dict[str, OverrideRecord]:
    """The override in force for each job at ``at`` (the newest, if several)."""
    records, _ = list_overrides(session=session, active_at=at, limit=1_000_000)
    active: dict[str, OverrideRecord] = {}
    for record in records:  # newest first
        active.setdefault(record.job_id, record)
    return active
