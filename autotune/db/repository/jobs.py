"""Jobs: their records, states (with when each first ran and ended, on the wall clock
and on the backend's), submission through the API, cancellation requests, online
throughput fits, listings and counts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session

from autotune.core import ACTIVE_STATES, JOB_STATES, JobSpec, JobState, utc_now
from autotune.db.repository.cursor import CursorError, decode_cursor, encode_cursor
from autotune.db.repository.paging import Page, bounded_count
from autotune.db.tables import JobRow
from autotune.serde import from_json, to_json

__all__ = [
    "JobRecord",
    "active_jobs",
    "cancel_requests",
    "get_job",
    "job_counts",
    "job_ids",
    "list_jobs",
    "request_cancel",
    "set_job_performance",
    "set_job_state",
    "submit_job",
    "submitted_job_ids",
    "upsert_job",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    spec: JobSpec
    state: JobState
    state_reason: str
    progress: float
    submitted_at: datetime
    updated_at: datetime
    task: dict[str, Any] | None = None
    """``{"name", "steps", "origin"}``, and ``"replay"`` (work in samples, reference GPUs,
    calibrated application) where the backend says; ``None`` when unknown."""
    cancel_requested_at: datetime | None = None
    started_at: datetime | None = None
    """When the daemon first saw the job running (or decided it so)."""
    finished_at: datetime | None = None
    """When the daemon first saw the job finished, failed or cancelled."""
    sim_submitted_s: float | None = None
    """Submission, start and end on the backend's clock, where the backend gives them."""
    sim_started_s: float | None = None
    sim_finished_s: float | None = None
    performance: dict[str, Any] | None = None
    """The job's online throughput fit (``JobRow.performance``)."""

    @property
    def jct_s(self) -> float | None:
        """Job completion time, seconds: end minus submission on the backend's clock
        where it gives both, else ``finished_at - submitted_at``; ``None`` while the job
        is active."""
        if self.sim_finished_s is not None and self.sim_submitted_s is not None:
            return self.sim_finished_s - self.sim_submitted_s
        if self.finished_at is not None:
            return (self.finished_at - self.submitted_at).total_seconds()
        return None


def _job_record(row: JobRow) -> JobRecord:
    return JobRecord(
        spec=from_json(JobSpec, row.spec),
        state=cast(JobState, row.state),  # checked by _check_state when written
        state_reason=row.state_reason,
        progress=row.progress,
        submitted_at=row.submitted_at,
        updated_at=row.updated_at,
        task=row.task,
        cancel_requested_at=row.cancel_requested_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        sim_submitted_s=row.sim_submitted_s,
        sim_started_s=row.sim_started_s,
        sim_finished_s=row.sim_finished_s,
        performance=row.performance,
    )


def set_job_performance(*, session: Session, job_id: str, performance: dict[str, Any]) -> None:
    """Store the job's online throughput fit (what ``GET /jobs/{id}`` shows)."""
    session.execute(update(JobRow).where(JobRow.job_id == job_id).values(performance=performance))


def _check_state(state: str) -> None:
    if state not in JOB_STATES:
        raise ValueError(f"job state {state!r}: must be one of {JOB_STATES}")


def _stamp(row: JobRow, now: datetime) -> None:
    """Record when the job first ran and when it first reached a final state."""
    if row.state == "running" and row.started_at is None:
        row.started_at = now
    if row.state not in ACTIVE_STATES and row.finished_at is None:
        row.finished_at = now


def upsert_job(
    *,
    session: Session,
    spec: JobSpec,
    state: JobState,
    reason: str = "",
    progress: float = 0.0,
    task: dict[str, Any] | None = None,
    sim_submitted_s: float | None = None,
    sim_started_s: float | None = None,
    sim_finished_s: float | None = None,
    at: datetime | None = None,
) -> None:
    """Create the job, or update its state, reason and progress (and its task, and its
    times on the backend's clock, where the row has none yet). ``started_at`` and
    ``finished_at`` are set when the job first shows running, and in a final state.
    ``at``: when (default now)."""
    _check_state(state)
    now = at or utc_now()
    row = session.get(JobRow, spec.job_id)
    if row is None:
        row = JobRow(
            job_id=spec.job_id,
            spec=to_json(spec),
            tenant=spec.tenant,
            state=state,
            state_reason=reason,
            progress=progress,
            submitted_at=now,
            updated_at=now,
            task=task,
            cancel_requested_at=None,
            started_at=None,
            finished_at=None,
            sim_submitted_s=sim_submitted_s,
            sim_started_s=sim_started_s,
            sim_finished_s=sim_finished_s,
        )
        _stamp(row, now)
        session.add(row)
        return
    if (row.state, row.state_reason, row.progress) != (state, reason, progress):
        row.state, row.state_reason, row.progress, row.updated_at = state, reason, progress, now
        _stamp(row, now)
    if row.task is None and task is not None:
        row.task = task
    elif row.task is not None and task and "replay" in task and "replay" not in row.task:
        # What replaying the job needs, as the backend tells it once the job runs there.
        row.task = {**row.task, "replay": task["replay"]}
    if row.sim_submitted_s is None and sim_submitted_s is not None:
        row.sim_submitted_s = sim_submitted_s
    if row.sim_started_s is None and sim_started_s is not None:
        row.sim_started_s = sim_started_s
    if row.sim_finished_s is None and sim_finished_s is not None:
        row.sim_finished_s = sim_finished_s


def submit_job(*, session: Session, spec: JobSpec, task: dict[str, Any]) -> JobRecord | None:
    """A new pending job (the daemon hands it to the backend at its next tick); ``None``
    when the id is taken."""
    if session.get(JobRow, spec.job_id) is not None:
        return None
    upsert_job(
        session=session,
        spec=spec,
        state="pending",
        reason="submitted; the daemon takes it at its next tick",
        task=task,
    )
    session.flush()
    record = get_job(session=session, job_id=spec.job_id)
    assert record is not None
    return record


def request_cancel(*, session: Session, job_id: str) -> JobRecord | None:
    """Ask the daemon to cancel an active job at its next tick (idempotent)."""
    row = session.get(JobRow, job_id)
    if row is None:
        return None
    if row.cancel_requested_at is None:
        row.cancel_requested_at = utc_now()
        row.updated_at = row.cancel_requested_at
    return _job_record(row)


def job_tenant(*, session: Session, job_id: str) -> str | None:
    """The tenant of a job; ``None`` when there is no such job."""
    return session.scalar(select(JobRow.tenant).where(JobRow.job_id == job_id))


def job_ids(*, session: Session) -> set[str]:
    """Every job id the database holds."""
    return set(session.scalars(select(JobRow.job_id)))


def submitted_job_ids(*, session: Session, origin: str = "api") -> list[str]:
    """Pending jobs that came in through ``origin`` (cheap: no spec is parsed)."""
    rows = session.execute(select(JobRow.job_id, JobRow.task).where(JobRow.state == "pending"))
    return [job_id for job_id, task in rows if task and task.get("origin") == origin]


def cancel_requests(*, session: Session) -> list[str]:
    """Active jobs a user asked to cancel."""
    return list(
        session.scalars(
            select(JobRow.job_id).where(
                JobRow.cancel_requested_at.is_not(None), JobRow.state.in_(ACTIVE_STATES)
            )
        )
    )


def set_job_state(
    *,
    session: Session,
    job_id: str,
    state: JobState,
    reason: str = "",
    progress: float | None = None,
    at: datetime | None = None,
) -> None:
    """``at``: when (default now)."""
    _check_state(state)
    row = session.get(JobRow, job_id)
    if row is None:
        raise KeyError(f"no job {job_id!r}")
    row.state, row.state_reason, row.updated_at = state, reason, at or utc_now()
    _stamp(row, row.updated_at)
    if progress is not None:
        row.progress = progress


def get_job(*, session: Session, job_id: str) -> JobRecord | None:
    row = session.get(JobRow, job_id)
    return None if row is None else _job_record(row)


def list_jobs(
    *,
    session: Session,
    state: JobState | None = None,
    tenant: str | None = None,
    limit: int = 100,
    offset: int = 0,
    cursor: str | None = None,
) -> Page[JobRecord]:
    """Jobs newest first (by submission, then id), of one ``tenant`` or all; ``cursor``:
    the page after the one that handed it out."""
    conditions: list[ColumnElement[bool]] = []
    if state is not None:
        _check_state(state)
        conditions.append(JobRow.state == state)
    if tenant is not None:
        conditions.append(JobRow.tenant == tenant)
    count, exact = bounded_count(session, JobRow.job_id, conditions)
    if cursor is not None:
        at, job_id = decode_cursor(cursor, str, str)
        try:
            submitted = datetime.fromisoformat(at)
        except ValueError:
            raise CursorError(f"not a cursor of this listing: {cursor[:40]!r}") from None
        if submitted.tzinfo is None:  # the listing hands out UTC times with their zone
            raise CursorError(f"not a cursor of this listing: {cursor[:40]!r}")
        conditions.append(
            or_(
                JobRow.submitted_at < submitted,
                and_(JobRow.submitted_at == submitted, JobRow.job_id > job_id),
            )
        )
    rows = list(
        session.scalars(
            select(JobRow)
            .where(*conditions)
            .order_by(JobRow.submitted_at.desc(), JobRow.job_id)
            .limit(limit + 1)
            .offset(offset)
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = (
        encode_cursor(rows[-1].submitted_at.isoformat(), rows[-1].job_id) if more else None
    )
    return Page([_job_record(row) for row in rows], count, exact, next_cursor)


def active_jobs(*, session: Session) -> list[JobRecord]:
    """Every pending or running job."""
    rows = session.scalars(
        select(JobRow).where(JobRow.state.in_(ACTIVE_STATES)).order_by(JobRow.submitted_at)
    )
    return [_job_record(row) for row in rows]


def job_counts(*, session: Session, states: Iterable[str] = JOB_STATES) -> dict[str, int]:
    """Jobs per state, of ``states`` (every one present, 0 when none)."""
    wanted = list(states)
    for state in wanted:
        _check_state(state)
    query = select(JobRow.state, func.count()).group_by(JobRow.state)
    if set(wanted) != set(JOB_STATES):
        query = query.where(JobRow.state.in_(wanted))
    counts: dict[str, int] = dict.fromkeys(wanted, 0)
    counts.update({state: n for state, n in session.execute(query)})
    return counts
