"""Metric samples: a tick's values recorded in one statement, and read back: a summary
over the JSON labels (counting retention's downsampled rows for the samples they
average), the newest per job, listings and pages."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select
from sqlalchemy.orm import Session

from autotune.core import utc_now
from autotune.db.repository.cursor import decode_cursor, encode_cursor
from autotune.db.repository.paging import Page, bounded_count
from autotune.db.tables import MetricRow

__all__ = [
    "MetricSample",
    "MetricSummary",
    "job_metrics",
    "latest_metric_samples",
    "list_metric_samples",
    "list_metrics",
    "record_metrics",
    "summarize_metric",
]


def record_metrics(
    *,
    session: Session,
    values: Iterable[tuple[str, float, str | None]],
    labels: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    """Store ``(name, value, job_id)`` samples taken at one moment (one statement)."""
    when = at or utc_now()
    rows = [
        {
            "name": name,
            "value": value,
            "job_id": job_id,
            "labels": labels or {},
            "recorded_at": when,
        }
        for name, value, job_id in values
    ]
    if rows:
        session.execute(insert(MetricRow), rows)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricSummary:
    """A metric's samples with one label value: how many rounds they cover (a sample
    downsampled by retention counts for the ``downsampled_n`` it averages), their mean,
    and the mean of the newest ``recent``."""

    rounds: int
    mean: float | None
    recent_mean: float | None
    recent_rounds: int


def summarize_metric(
    *,
    session: Session,
    name: str,
    label: str,
    value: str,
    since: datetime | None = None,
    recent: int = 20,
) -> MetricSummary:
    """Summarise the samples of ``name`` whose ``labels[label] == value`` (from
    ``since`` on): in the database, over the JSON labels, on SQLite and PostgreSQL alike."""
    weight = func.coalesce(MetricRow.labels["downsampled_n"].as_float(), 1.0)
    conditions: list[ColumnElement[bool]] = [
        MetricRow.name == name,
        MetricRow.labels[label].as_string() == value,
    ]
    if since is not None:
        conditions.append(MetricRow.recorded_at >= since)
    total, weighted = session.execute(
        select(func.sum(weight), func.sum(MetricRow.value * weight)).where(*conditions)
    ).one()
    newest = (
        select(MetricRow.value)
        .where(*conditions)
        .order_by(MetricRow.id.desc())
        .limit(recent)
        .subquery()
    )
    recent_mean, recent_n = session.execute(select(func.avg(newest.c.value), func.count())).one()
    rounds = round(float(total or 0))
    return MetricSummary(
        rounds=rounds,
        mean=float(weighted) / float(total) if total else None,
        recent_mean=None if recent_mean is None else float(recent_mean),
        recent_rounds=int(recent_n or 0),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricSample:
    name: str
    value: float
    job_id: str | None
    recorded_at: datetime


def job_metrics(*, session: Session, job_id: str, scan: int = 500) -> dict[str, float]:
    """The newest value of each ``job_*`` metric recorded for ``job_id`` (among its
    ``scan`` newest samples), keyed without the prefix."""
    query = (
        select(MetricRow)
        .where(MetricRow.job_id == job_id, MetricRow.name.like("job\\_%", escape="\\"))
        .order_by(MetricRow.id.desc())
        .limit(scan)
    )
    newest: dict[str, float] = {}
    for row in session.scalars(query):
        newest.setdefault(row.name.removeprefix("job_"), row.value)
    return newest


def list_metrics(
    *,
    session: Session,
    names: Sequence[str],
    since: datetime | None = None,
    limit: int = 10_000,
) -> list[MetricSample]:
    """Samples of the named metrics, oldest first (the newest ``limit`` of them)."""
    rows = _metric_rows(session, _metric_conditions(names, None, since), limit)
    return [_sample(r) for r in rows[::-1]]


def latest_metric_samples(
    *, session: Session, name: str, within_s: float = 0.0
) -> list[MetricSample]:
    """The newest sample of ``name`` per job among those recorded at most ``within_s``
    before its newest one (0: that tick's only); two index ranges, whatever the
    history's length."""
    newest = session.scalar(
        select(MetricRow.recorded_at)
        .where(MetricRow.name == name)
        .order_by(MetricRow.id.desc())
        .limit(1)
    )
    if newest is None:
        return []
    rows = session.execute(
        select(*_METRIC_COLUMNS)
        .where(
            MetricRow.recorded_at >= newest - timedelta(seconds=within_s),
            MetricRow.name == name,
        )
        .order_by(MetricRow.id)
    )
    by_job = {r.job_id: _sample(r) for r in rows}  # the newest wins
    return list(by_job.values())


_METRIC_COLUMNS = (
    MetricRow.id,
    MetricRow.name,
    MetricRow.value,
    MetricRow.job_id,
    MetricRow.recorded_at,
)


def _sample(row: Any) -> MetricSample:
    return MetricSample(
        name=row.name, value=row.value, job_id=row.job_id, recorded_at=row.recorded_at
    )


def _metric_conditions(
    names: Sequence[str], job_id: str | None, since: datetime | None
) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if len(names) == 1:
        conditions.append(MetricRow.name == names[0])
    elif names:
        conditions.append(MetricRow.name.in_(list(names)))
    if job_id is not None:
        conditions.append(MetricRow.job_id == job_id)
    if since is not None:
        conditions.append(MetricRow.recorded_at >= since)
    return conditions


def _metric_rows(
    session: Session, conditions: Sequence[ColumnElement[bool]], limit: int
) -> list[Any]:
    """Up to ``limit`` rows matching ``conditions``, newest first."""
    return list(
        session.execute(
            select(*_METRIC_COLUMNS).where(*conditions).order_by(MetricRow.id.desc()).limit(limit)
        )
    )


def list_metric_samples(
    *,
    session: Session,
    names: Sequence[str] = (),
    job_id: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Page[MetricSample]:
    """Samples newest first, of the named metrics (all when ``names`` is empty) and of
    ``job_id`` (when given); ``cursor``: the page after the one that handed it out."""
    conditions = _metric_conditions(names, job_id, since)
    count, exact = bounded_count(session, MetricRow.id, conditions)
    if cursor is not None:
        (before,) = decode_cursor(cursor, int)
        conditions.append(MetricRow.id < before)
    rows = _metric_rows(session, conditions, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    samples = [_sample(r) for r in rows]
    return Page(samples, count, exact, encode_cursor(rows[-1].id) if more else None)
