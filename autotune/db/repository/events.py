"""Job events: what happened to a job on the backend while it trained, as the backend
reported it (``autotune.interfaces.JobEvents``), stored by the daemon's tick and listed
per job, oldest first."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from autotune.db.repository.cursor import decode_cursor, encode_cursor
from autotune.db.repository.paging import Page, bounded_count
from autotune.db.tables import JobEventRow

__all__ = ["JobEventRecord", "list_job_events", "recent_job_events", "record_job_events"]


@dataclass(frozen=True, slots=True)
class JobEventRecord:
    event_id: int
    job_id: str
    kind: str
    at: datetime
    detail: dict[str, Any]


def _plain(value: Any) -> Any:
    """``value`` as plain JSON that every database takes: tuples as lists, numpy scalars
    as numbers, a non-finite float (which PostgreSQL's JSON refuses) as its name
    (``"nan"``, ``"inf"``), anything else unknown as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def record_job_events(*, session: Session, events: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
    """Store ``(job_id, event)`` pairs; each event has a ``kind`` and ``at`` (Unix time,
    the backend's clock), its other fields kept as its detail. Returns how many."""
    n = 0
    for job_id, event in events:
        detail = {str(k): _plain(v) for k, v in event.items() if k not in ("kind", "at")}
        session.add(
            JobEventRow(
                job_id=str(job_id)[:128],
                kind=str(event.get("kind") or "unknown")[:64],
                at=_when(event.get("at")),
                detail=detail,
            )
        )
        n += 1
    return n


def _when(at: Any) -> datetime:
    """An event's Unix time as a datetime; now where it is missing or not a time (a
    malformed event is stored, never a reason for the tick's write to fail)."""
    try:
        return datetime.fromtimestamp(float(at), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return datetime.now(UTC)


def _record(row: JobEventRow) -> JobEventRecord:
    return JobEventRecord(
        event_id=row.id, job_id=row.job_id, kind=row.kind, at=row.at, detail=dict(row.detail)
    )


def recent_job_events(
    *, session: Session, since: datetime | None = None, limit: int = 40
) -> list[JobEventRecord]:
    """Every job's events, the newest ``limit`` (at or after ``since`` where given),
    newest first: what the dashboard lists."""
    query = select(JobEventRow).order_by(JobEventRow.id.desc()).limit(limit)
    if since is not None:
        query = query.where(JobEventRow.at >= since)
    return [_record(row) for row in session.scalars(query)]


def list_job_events(
    *,
    session: Session,
    job_id: str,
    kind: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Page[JobEventRecord]:
    """One job's events, oldest first, of one kind when given."""
    conditions: list[ColumnElement[bool]] = [JobEventRow.job_id == job_id]
    if kind is not None:
        conditions.append(JobEventRow.kind == kind)
    count, exact = bounded_count(session, JobEventRow.id, conditions)
    if cursor is not None:
        (last,) = decode_cursor(cursor, int)
        conditions.append(JobEventRow.id > last)
    rows = list(
        session.scalars(
            select(JobEventRow).where(*conditions).order_by(JobEventRow.id).limit(limit + 1)
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        rows=[_record(r) for r in rows],
        count=count,
        count_exact=exact,
        next_cursor=encode_cursor(rows[-1].id) if more and rows else None,
    )
