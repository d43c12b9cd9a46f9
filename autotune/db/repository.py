"""Repository functions: the only way the daemon, the API and replay touch the tables.

Keyword-only, one session per call site (the caller owns the transaction), core types
in and out where one exists.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import ColumnElement, and_, delete, func, insert, or_, select
from sqlalchemy.orm import Session

from autotune.core import (
    ACTIVE_STATES,
    JOB_STATES,
    Decision,
    JobConfig,
    JobSpec,
    JobState,
    NodeInfo,
    Placement,
    utc_now,
)
from autotune.db.tables import (
    ApiTokenRow,
    DecisionRow,
    JobRow,
    MetricRow,
    NodeRow,
    OverrideRow,
    PolicyVersionRow,
    TransitionRow,
)
from autotune.serde import from_json, to_json

__all__ = [
    "ACTIVE_STATES",
    "COUNT_CAP",
    "JOB_STATES",
    "CursorError",
    "DecisionRecord",
    "JobRecord",
    "MetricSample",
    "NodeRecord",
    "OverrideRecord",
    "Page",
    "PolicyVersionRecord",
    "active_jobs",
    "active_overrides",
    "active_policy_version",
    "add_token_hash",
    "cancel_requests",
    "create_decision",
    "create_decisions",
    "create_override",
    "create_transition",
    "decision_counts",
    "delete_override",
    "get_decision",
    "get_job",
    "get_override",
    "job_counts",
    "job_ids",
    "latest_decision_records",
    "latest_decisions",
    "list_decision_rows",
    "list_decisions",
    "list_jobs",
    "list_metric_samples",
    "list_metrics",
    "list_nodes",
    "list_overrides",
    "list_policy_versions",
    "mark_decision_applied",
    "node_records",
    "record_metrics",
    "register_policy_version",
    "replace_token_hashes",
    "request_cancel",
    "running_placements",
    "set_job_state",
    "submit_job",
    "submitted_job_ids",
    "token_hashes",
    "upsert_job",
    "upsert_nodes",
]


T = TypeVar("T")

COUNT_CAP = 10_000
"""Listings count the rows that match up to this many: beyond it the count is a lower
bound (``Page.count_exact`` is false), so no request's cost grows with the history."""


class CursorError(ValueError):
    """A pagination cursor this listing did not hand out."""


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing, newest first.

    ``next_cursor`` continues right after the page's last row (keyset pagination: the
    cost of a page does not depend on how deep it is, and rows written meanwhile never
    shift it); ``None`` on the last page. ``count`` is how many rows match, exact when
    ``count_exact``, else at least ``COUNT_CAP``."""

    rows: list[T]
    count: int
    count_exact: bool
    next_cursor: str | None


def encode_cursor(*values: str | int) -> str:
    """An opaque cursor holding the sort key of a page's last row."""
    raw = json.dumps(list(values), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *types: type) -> tuple[Any, ...]:
    """The sort key in ``cursor``, checked against ``types``; ``CursorError`` if it is not
    one this listing hands out."""
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise CursorError(f"not a cursor: {cursor[:40]!r}") from None
    if (
        not isinstance(values, list)
        or len(values) != len(types)
        or not all(type(v) is t for v, t in zip(values, types, strict=True))
    ):
        raise CursorError(f"not a cursor of this listing: {cursor[:40]!r}")
    return tuple(values)


def _bounded_count(
    session: Session, key: Any, conditions: Sequence[ColumnElement[bool]]
) -> tuple[int, bool]:
    """How many rows match ``conditions``, reading at most ``COUNT_CAP + 1`` entries of
    an index that holds ``key``: ``(count, exact)``."""
    sub = select(key).where(*conditions).limit(COUNT_CAP + 1).subquery()
    n = int(session.scalar(select(func.count()).select_from(sub)) or 0)
    return (COUNT_CAP, False) if n > COUNT_CAP else (n, True)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    spec: JobSpec
    state: JobState
    state_reason: str
    progress: float
    submitted_at: datetime
    updated_at: datetime
    task: dict[str, Any] | None = None
    """``{"name", "steps", "origin"}``; ``None`` when unknown."""
    cancel_requested_at: datetime | None = None
    started_at: datetime | None = None
    """When the daemon first saw the job running (or decided it so)."""
    finished_at: datetime | None = None
    """When the daemon first saw the job finished, failed or cancelled."""
    sim_submitted_s: float | None = None
    """Submission, start and end on the backend's clock, where the backend gives them."""
    sim_started_s: float | None = None
    sim_finished_s: float | None = None

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
    )


def _decision(row: DecisionRow) -> Decision:
    return Decision(
        decision_id=row.id,
        job_id=row.job_id,
        config=from_json(JobConfig, row.config),
        placement=None if row.placement is None else from_json(Placement, row.placement),
        source=row.source,  # type: ignore[arg-type]  # checked by Decision.__post_init__
        policy_version=row.policy_version,
        reason=row.reason,
        decided_at=row.decided_at,
    )


# --- nodes ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRecord:
    info: NodeInfo
    state: str
    """``alive`` or ``lost``."""
    lost_at: datetime | None


def upsert_nodes(
    *,
    session: Session,
    nodes: Iterable[NodeInfo],
    lost: Iterable[NodeInfo] = (),
    at: datetime | None = None,
) -> list[str]:
    """Record the backend's alive ``nodes`` and its ``lost`` ones; returns the names of
    nodes that are newly lost. ``at``: when (default now)."""
    now = at or utc_now()
    newly_lost: list[str] = []
    for node, state in [*((n, "alive") for n in nodes), *((n, "lost") for n in lost)]:
        row = session.get(NodeRow, node.node_id)
        info = to_json(node)
        if row is None:
            session.add(
                NodeRow(
                    node_id=node.node_id,
                    gpu_model=node.gpu_model,
                    gpu_count=node.gpu_count,
                    info=info,
                    updated_at=now,
                    state=state,
                    lost_at=now if state == "lost" else None,
                )
            )
            if state == "lost":
                newly_lost.append(node.node_id)
            continue
        if row.info != info:
            row.gpu_model, row.gpu_count, row.info, row.updated_at = (
                node.gpu_model,
                node.gpu_count,
                info,
                now,
            )
        if row.state != state:
            row.state, row.updated_at = state, now
            row.lost_at = now if state == "lost" else None
            if state == "lost":
                newly_lost.append(node.node_id)
    return newly_lost


def list_nodes(*, session: Session) -> list[NodeInfo]:
    """The alive nodes (the ones jobs can be placed on)."""
    rows = session.scalars(
        select(NodeRow).where(NodeRow.state == "alive").order_by(NodeRow.node_id)
    )
    return [from_json(NodeInfo, row.info) for row in rows]


def node_records(*, session: Session) -> list[NodeRecord]:
    """Every node the daemon has seen, alive or lost."""
    rows = session.scalars(select(NodeRow).order_by(NodeRow.node_id))
    return [
        NodeRecord(info=from_json(NodeInfo, row.info), state=row.state, lost_at=row.lost_at)
        for row in rows
    ]


# --- jobs -----------------------------------------------------------------------------


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
    limit: int = 100,
    offset: int = 0,
    cursor: str | None = None,
) -> Page[JobRecord]:
    """Jobs newest first (by submission, then id); ``cursor``: the page after the one
    that handed it out."""
    conditions: list[ColumnElement[bool]] = []
    if state is not None:
        _check_state(state)
        conditions.append(JobRow.state == state)
    count, exact = _bounded_count(session, JobRow.job_id, conditions)
    if cursor is not None:
        at, job_id = decode_cursor(cursor, str, str)
        try:
            submitted = datetime.fromisoformat(at)
        except ValueError:
            raise CursorError(f"not a cursor of this listing: {cursor[:40]!r}") from None
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


# --- decisions ------------------------------------------------------------------------


def create_decision(
    *,
    session: Session,
    decision: Decision,
    override_id: int | None = None,
    explanation: dict[str, Any] | None = None,
) -> Decision:
    """Store a decision; returns it with its ``decision_id`` (flushed, not committed)."""
    (stored,) = create_decisions(session=session, decisions=[(decision, override_id, explanation)])
    return stored


def create_decisions(
    *,
    session: Session,
    decisions: Sequence[tuple[Decision, int | None, dict[str, Any] | None]],
) -> list[Decision]:
    """Store ``(decision, override_id, explanation)`` triples in one statement; returns
    the decisions with their ``decision_id`` in the same order (not committed)."""
    if not decisions:
        return []
    ids = session.scalars(
        insert(DecisionRow).returning(DecisionRow.id, sort_by_parameter_order=True),
        [
            {
                "job_id": decision.job_id,
                "source": decision.source,
                "policy_version": decision.policy_version,
                "decided_at": decision.decided_at,
                "reason": decision.reason,
                "config": to_json(decision.config),
                "placement": None if decision.placement is None else to_json(decision.placement),
                "override_id": override_id,
                "applied_at": None,
                "explanation": explanation,
            }
            for decision, override_id, explanation in decisions
        ],
    ).all()
    return [
        replace(decision, decision_id=decision_id)
        for (decision, _, _), decision_id in zip(decisions, ids, strict=True)
    ]


def mark_decision_applied(
    *, session: Session, decision_ids: Sequence[int], at: datetime | None = None
) -> None:
    when = at or utc_now()
    for decision_id in decision_ids:
        row = session.get(DecisionRow, decision_id)
        if row is None:
            raise KeyError(f"no decision {decision_id}")
        row.applied_at = when


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    decision: Decision
    applied_at: datetime | None
    override_id: int | None = None
    explanation: dict[str, Any] | None = None


def _decision_record(row: DecisionRow) -> DecisionRecord:
    return DecisionRecord(
        decision=_decision(row),
        applied_at=row.applied_at,
        override_id=row.override_id,
        explanation=row.explanation,
    )


def get_decision(*, session: Session, decision_id: int) -> DecisionRecord | None:
    row = session.get(DecisionRow, decision_id)
    return None if row is None else _decision_record(row)


def _decision_conditions(
    job_id: str | None, source: str | None, since: datetime | None, cursor: str | None
) -> tuple[list[ColumnElement[bool]], list[ColumnElement[bool]]]:
    """The listing's filters, and the filters plus the cursor's position."""
    conditions: list[ColumnElement[bool]] = []
    if job_id is not None:
        conditions.append(DecisionRow.job_id == job_id)
    if source is not None:
        conditions.append(DecisionRow.source == source)
    if since is not None:
        conditions.append(DecisionRow.decided_at >= since)
    positioned = list(conditions)
    if cursor is not None:
        (before,) = decode_cursor(cursor, int)
        positioned.append(DecisionRow.id < before)
    return conditions, positioned


def _decision_page(
    session: Session,
    columns: Sequence[Any],
    *,
    job_id: str | None,
    source: str | None,
    since: datetime | None,
    limit: int,
    offset: int,
    cursor: str | None,
) -> tuple[list[Any], int, bool, str | None]:
    conditions, positioned = _decision_conditions(job_id, source, since, cursor)
    count, exact = _bounded_count(session, DecisionRow.id, conditions)
    rows = list(
        session.execute(
            select(*columns)
            .where(*positioned)
            .order_by(DecisionRow.id.desc())
            .limit(limit + 1)
            .offset(offset)
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, count, exact, encode_cursor(rows[-1].id) if more else None


def list_decisions(
    *,
    session: Session,
    job_id: str | None = None,
    source: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
    cursor: str | None = None,
) -> Page[DecisionRecord]:
    """Decisions newest first, filtered; ``cursor``: the page after the one that handed
    it out."""
    rows, count, exact, next_cursor = _decision_page(
        session,
        [DecisionRow.id, DecisionRow],
        job_id=job_id,
        source=source,
        since=since,
        limit=limit,
        offset=offset,
        cursor=cursor,
    )
    return Page([_decision_record(r.DecisionRow) for r in rows], count, exact, next_cursor)


_DECISION_COLUMNS = (
    DecisionRow.id,
    DecisionRow.job_id,
    DecisionRow.source,
    DecisionRow.policy_version,
    DecisionRow.decided_at,
    DecisionRow.applied_at,
    DecisionRow.reason,
    DecisionRow.config,
    DecisionRow.placement,
    DecisionRow.override_id,
)


def list_decision_rows(
    *,
    session: Session,
    job_id: str | None = None,
    source: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
    cursor: str | None = None,
) -> Page[dict[str, Any]]:
    """``list_decisions`` as stored JSON, for the API's listing: only the columns it
    shows (not the explanation), and not rebuilt into dataclasses (they were valid
    decisions when written); about a third of the cost of ``list_decisions``."""
    rows, count, exact, next_cursor = _decision_page(
        session,
        _DECISION_COLUMNS,
        job_id=job_id,
        source=source,
        since=since,
        limit=limit,
        offset=offset,
        cursor=cursor,
    )
    return Page([row._asdict() for row in rows], count, exact, next_cursor)


def decision_counts(*, session: Session, after_id: int = 0) -> tuple[dict[str, int], int]:
    """Decisions per source with an id above ``after_id``, and the highest id counted
    (``after_id`` when there is none): callers keep a running total and count only what
    is new, so the cost follows the new rows, not the history."""
    rows = session.execute(
        select(DecisionRow.source, func.count(), func.max(DecisionRow.id))
        .where(DecisionRow.id > after_id)
        .group_by(DecisionRow.source)
    ).all()
    return {source: n for source, n, _ in rows}, max((top for *_, top in rows), default=after_id)


def latest_decision_records(
    *, session: Session, job_ids: Iterable[str] | None = None
) -> dict[str, DecisionRecord]:
    """The newest decision of every job (of ``job_ids``, when given), with its override."""
    newest = select(func.max(DecisionRow.id)).group_by(DecisionRow.job_id)
    if job_ids is not None:
        newest = newest.where(DecisionRow.job_id.in_(list(job_ids)))
    rows = session.scalars(select(DecisionRow).where(DecisionRow.id.in_(newest)))
    return {row.job_id: _decision_record(row) for row in rows}


def latest_decisions(*, session: Session) -> dict[str, Decision]:
    """The newest decision of every job."""
    newest = select(func.max(DecisionRow.id)).group_by(DecisionRow.job_id)
    rows = session.scalars(select(DecisionRow).where(DecisionRow.id.in_(newest)))
    return {row.job_id: _decision(row) for row in rows}


def running_placements(*, session: Session) -> dict[str, Placement]:
    """Where running jobs are: the placement of each running job's newest decision."""
    newest = (
        select(func.max(DecisionRow.id))
        .join(JobRow, JobRow.job_id == DecisionRow.job_id)
        .where(JobRow.state == "running", DecisionRow.placement.is_not(None))
        .group_by(DecisionRow.job_id)
    )
    rows = session.scalars(select(DecisionRow).where(DecisionRow.id.in_(newest)))
    return {row.job_id: from_json(Placement, row.placement) for row in rows}


# --- metrics, transitions, policy versions --------------------------------------------


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


def create_transition(
    *,
    session: Session,
    policy_version: str,
    observation: dict[str, Any],
    action: dict[str, Any],
    reward: float,
    next_observation: dict[str, Any],
    action_logp: float | None = None,
    at: datetime | None = None,
) -> int:
    """``at``: when (default now)."""
    row = TransitionRow(
        policy_version=policy_version,
        observation=observation,
        action=action,
        reward=reward,
        next_observation=next_observation,
        action_logp=action_logp,
        created_at=at or utc_now(),
    )
    session.add(row)
    session.flush()
    return row.id


def register_policy_version(
    *,
    session: Session,
    version: str,
    kind: str,
    checkpoint_path: str | None = None,
    activate: bool = False,
    metrics: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    """Record a policy version (idempotent); ``activate`` makes it the only active one.
    ``at``: when it is first recorded (default now)."""
    row = session.get(PolicyVersionRow, version)
    if row is None:
        row = PolicyVersionRow(
            version=version,
            kind=kind,
            checkpoint_path=checkpoint_path,
            active=False,
            metrics=metrics or {},
            created_at=at or utc_now(),
        )
        session.add(row)
    if activate:
        for other in session.scalars(select(PolicyVersionRow).where(PolicyVersionRow.active)):
            other.active = False
        row.active = True


def active_policy_version(*, session: Session) -> str | None:
    return session.scalar(select(PolicyVersionRow.version).where(PolicyVersionRow.active))


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyVersionRecord:
    version: str
    kind: str
    checkpoint_path: str | None
    active: bool
    metrics: dict[str, Any]
    created_at: datetime


def list_policy_versions(*, session: Session) -> list[PolicyVersionRecord]:
    """Every registered policy version, newest first."""
    rows = session.scalars(
        select(PolicyVersionRow).order_by(
            PolicyVersionRow.created_at.desc(), PolicyVersionRow.version
        )
    )
    return [
        PolicyVersionRecord(
            version=r.version,
            kind=r.kind,
            checkpoint_path=r.checkpoint_path,
            active=r.active,
            metrics=r.metrics,
            created_at=r.created_at,
        )
        for r in rows
    ]


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
    page = list_metric_samples(session=session, names=names, since=since, limit=limit)
    return page.rows[::-1]


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
    conditions: list[ColumnElement[bool]] = []
    if len(names) == 1:
        conditions.append(MetricRow.name == names[0])
    elif names:
        conditions.append(MetricRow.name.in_(list(names)))
    if job_id is not None:
        conditions.append(MetricRow.job_id == job_id)
    if since is not None:
        conditions.append(MetricRow.recorded_at >= since)
    count, exact = _bounded_count(session, MetricRow.id, conditions)
    if cursor is not None:
        (before,) = decode_cursor(cursor, int)
        conditions.append(MetricRow.id < before)
    rows = list(
        session.execute(
            select(
                MetricRow.id,
                MetricRow.name,
                MetricRow.value,
                MetricRow.job_id,
                MetricRow.recorded_at,
            )
            .where(*conditions)
            .order_by(MetricRow.id.desc())
            .limit(limit + 1)
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    samples = [
        MetricSample(name=r.name, value=r.value, job_id=r.job_id, recorded_at=r.recorded_at)
        for r in rows
    ]
    return Page(samples, count, exact, encode_cursor(rows[-1].id) if more else None)


# --- overrides ------------------------------------------------------------------------


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
) -> tuple[list[OverrideRecord], int]:
    """Overrides newest first (only those active at ``active_at``, or only those that
    had ended by ``ended_at``, when given)."""
    query = select(OverrideRow)
    if job_id is not None:
        query = query.where(OverrideRow.job_id == job_id)
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


# --- API token ------------------------------------------------------------------------


def token_hashes(*, session: Session) -> list[str]:
    """SHA-256 hex digests of the stored API tokens."""
    return list(session.scalars(select(ApiTokenRow.token_sha256)))


def add_token_hash(*, session: Session, token_sha256: str) -> None:
    session.add(ApiTokenRow(token_sha256=token_sha256, created_at=utc_now()))


def replace_token_hashes(*, session: Session, token_sha256: str) -> int:
    """Make ``token_sha256`` the only stored token; returns how many were removed."""
    removed = len(session.scalars(delete(ApiTokenRow).returning(ApiTokenRow.id)).all())
    add_token_hash(session=session, token_sha256=token_sha256)
    return removed
