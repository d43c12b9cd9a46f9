"""Repository functions: the only way the daemon, the API and replay touch the tables.

Keyword-only, one session per call site (the caller owns the transaction), core types
in and out where one exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autotune.core import Decision, JobConfig, JobSpec, NodeInfo, Placement, utc_now
from autotune.db.models import (
    DecisionRow,
    JobRow,
    MetricRow,
    NodeRow,
    PolicyVersionRow,
    TransitionRow,
)
from autotune.serde import from_json, to_json

__all__ = [
    "JOB_STATES",
    "JobRecord",
    "active_policy_version",
    "create_decision",
    "create_transition",
    "get_decision",
    "get_job",
    "job_counts",
    "latest_decisions",
    "list_decisions",
    "list_jobs",
    "list_nodes",
    "mark_decision_applied",
    "record_metrics",
    "register_policy_version",
    "running_placements",
    "set_job_state",
    "upsert_job",
    "upsert_nodes",
]

JOB_STATES = ("pending", "running", "finished", "failed", "cancelled")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    spec: JobSpec
    state: str
    state_reason: str
    progress: float
    submitted_at: datetime
    updated_at: datetime


def _job_record(row: JobRow) -> JobRecord:
    return JobRecord(
        spec=from_json(JobSpec, row.spec),
        state=row.state,
        state_reason=row.state_reason,
        progress=row.progress,
        submitted_at=row.submitted_at,
        updated_at=row.updated_at,
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


def upsert_nodes(*, session: Session, nodes: Iterable[NodeInfo]) -> None:
    now = utc_now()
    for node in nodes:
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
                )
            )
        elif row.info != info:
            row.gpu_model, row.gpu_count, row.info, row.updated_at = (
                node.gpu_model,
                node.gpu_count,
                info,
                now,
            )


def list_nodes(*, session: Session) -> list[NodeInfo]:
    rows = session.scalars(select(NodeRow).order_by(NodeRow.node_id))
    return [from_json(NodeInfo, row.info) for row in rows]


# --- jobs -----------------------------------------------------------------------------


def _check_state(state: str) -> None:
    if state not in JOB_STATES:
        raise ValueError(f"job state {state!r}: must be one of {JOB_STATES}")


def upsert_job(
    *, session: Session, spec: JobSpec, state: str, reason: str = "", progress: float = 0.0
) -> None:
    """Create the job, or update its state, reason and progress."""
    _check_state(state)
    now = utc_now()
    row = session.get(JobRow, spec.job_id)
    if row is None:
        session.add(
            JobRow(
                job_id=spec.job_id,
                spec=to_json(spec),
                state=state,
                state_reason=reason,
                progress=progress,
                submitted_at=now,
                updated_at=now,
            )
        )
    elif (row.state, row.state_reason, row.progress) != (state, reason, progress):
        row.state, row.state_reason, row.progress, row.updated_at = state, reason, progress, now


def set_job_state(
    *, session: Session, job_id: str, state: str, reason: str = "", progress: float | None = None
) -> None:
    _check_state(state)
    row = session.get(JobRow, job_id)
    if row is None:
        raise KeyError(f"no job {job_id!r}")
    row.state, row.state_reason, row.updated_at = state, reason, utc_now()
    if progress is not None:
        row.progress = progress


def get_job(*, session: Session, job_id: str) -> JobRecord | None:
    row = session.get(JobRow, job_id)
    return None if row is None else _job_record(row)


def list_jobs(
    *, session: Session, state: str | None = None, limit: int = 100, offset: int = 0
) -> tuple[list[JobRecord], int]:
    """Jobs newest first, and how many match in all."""
    query = select(JobRow)
    if state is not None:
        _check_state(state)
        query = query.where(JobRow.state == state)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(
        query.order_by(JobRow.submitted_at.desc(), JobRow.job_id).limit(limit).offset(offset)
    )
    return [_job_record(row) for row in rows], total


def job_counts(*, session: Session) -> dict[str, int]:
    """Jobs per state, every state present."""
    rows = session.execute(select(JobRow.state, func.count()).group_by(JobRow.state))
    counts = dict.fromkeys(JOB_STATES, 0)
    counts.update({state: n for state, n in rows})
    return counts


# --- decisions ------------------------------------------------------------------------


def create_decision(
    *, session: Session, decision: Decision, override_id: int | None = None
) -> Decision:
    """Store a decision; returns it with its ``decision_id`` (flushed, not committed)."""
    row = DecisionRow(
        job_id=decision.job_id,
        source=decision.source,
        policy_version=decision.policy_version,
        decided_at=decision.decided_at,
        reason=decision.reason,
        config=to_json(decision.config),
        placement=None if decision.placement is None else to_json(decision.placement),
        override_id=override_id,
        applied_at=None,
    )
    session.add(row)
    session.flush()
    return replace(decision, decision_id=row.id)


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


def get_decision(*, session: Session, decision_id: int) -> DecisionRecord | None:
    row = session.get(DecisionRow, decision_id)
    return (
        None if row is None else DecisionRecord(decision=_decision(row), applied_at=row.applied_at)
    )


def list_decisions(
    *,
    session: Session,
    job_id: str | None = None,
    source: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[DecisionRecord], int]:
    """Decisions newest first, filtered, and how many match in all."""
    query = select(DecisionRow)
    if job_id is not None:
        query = query.where(DecisionRow.job_id == job_id)
    if source is not None:
        query = query.where(DecisionRow.source == source)
    if since is not None:
        query = query.where(DecisionRow.decided_at >= since)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(DecisionRow.id.desc()).limit(limit).offset(offset))
    return [DecisionRecord(decision=_decision(r), applied_at=r.applied_at) for r in rows], total


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
    """Store ``(name, value, job_id)`` samples taken at one moment."""
    when = at or utc_now()
    session.add_all(
        MetricRow(name=name, value=value, job_id=job_id, labels=labels or {}, recorded_at=when)
        for name, value, job_id in values
    )


def create_transition(
    *,
    session: Session,
    policy_version: str,
    observation: dict[str, Any],
    action: dict[str, Any],
    reward: float,
    next_observation: dict[str, Any],
    action_logp: float | None = None,
) -> int:
    row = TransitionRow(
        policy_version=policy_version,
        observation=observation,
        action=action,
        reward=reward,
        next_observation=next_observation,
        action_logp=action_logp,
        created_at=utc_now(),
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
) -> None:
    """Record a policy version (idempotent); ``activate`` makes it the only active one."""
    row = session.get(PolicyVersionRow, version)
    if row is None:
        row = PolicyVersionRow(
            version=version,
            kind=kind,
            checkpoint_path=checkpoint_path,
            active=False,
            metrics=metrics or {},
            created_at=utc_now(),
        )
        session.add(row)
    if activate:
        for other in session.scalars(select(PolicyVersionRow).where(PolicyVersionRow.active)):
            other.active = False
        row.active = True


def active_policy_version(*, session: Session) -> str | None:
    return session.scalar(select(PolicyVersionRow.version).where(PolicyVersionRow.active))
