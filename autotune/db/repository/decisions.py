"""Decisions: stored a round at a time (with the leader term of the daemon storing
them), marked applied, and read back: one, a page, counts per source, the newest per
job, where running jobs are placed. A shadow policy's decisions are stored too, and
never count as taken."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select
from sqlalchemy.orm import Session

from autotune.core import Decision, JobConfig, Placement, utc_now
from autotune.db.repository.cursor import decode_cursor, encode_cursor
from autotune.db.repository.paging import Page, bounded_count
from autotune.db.tables import DecisionRow, JobRow
from autotune.serde import from_json, to_json

__all__ = [
    "DecisionRecord",
    "create_decision",
    "create_decisions",
    "decision_counts",
    "get_decision",
    "latest_decision_records",
    "latest_decisions",
    "list_decision_rows",
    "list_decisions",
    "mark_decision_applied",
    "running_placements",
]


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
        preempt=bool(row.preempt),
    )


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
    term: int | None = None,
) -> list[Decision]:
    """Store ``(decision, override_id, explanation)`` triples in one statement; returns
    the decisions with their ``decision_id`` in the same order (not committed).
    ``term``: the leader term of the daemon storing them (``autotune.db.lease``)."""
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
                "preempt": decision.preempt,
                "term": term,
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
        if row.applied_at is None:  # the first time it was applied
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


_TAKEN: ColumnElement[bool] = DecisionRow.source != "shadow"
"""Decisions the daemon took (applied, or committed to be): not a shadow policy's."""


def get_decision(*, session: Session, decision_id: int) -> DecisionRecord | None:
    row = session.get(DecisionRow, decision_id)
    return None if row is None else _decision_record(row)


def _decision_conditions(
    job_id: str | None,
    source: str | None,
    since: datetime | None,
    cursor: str | None,
    policy_version: str | None = None,
    tenant: str | None = None,
) -> tuple[list[ColumnElement[bool]], list[ColumnElement[bool]]]:
    """The listing's filters, and the filters plus the cursor's position. Without a
    ``source``, the decisions taken (every source but ``shadow``: a shadow policy's
    decisions are listed only when asked for). ``tenant``: only its jobs'."""
    conditions: list[ColumnElement[bool]] = []
    if job_id is not None:
        conditions.append(DecisionRow.job_id == job_id)
    if tenant is not None:
        conditions.append(
            DecisionRow.job_id.in_(select(JobRow.job_id).where(JobRow.tenant == tenant))
        )
    if policy_version is not None:
        conditions.append(DecisionRow.policy_version == policy_version)
    if source is not None:
        conditions.append(DecisionRow.source == source)
    else:
        conditions.append(_TAKEN)
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
    policy_version: str | None = None,
    tenant: str | None = None,
) -> tuple[list[Any], int, bool, str | None]:
    conditions, positioned = _decision_conditions(
        job_id, source, since, cursor, policy_version, tenant
    )
    count, exact = bounded_count(session, DecisionRow.id, conditions)
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
    policy_version: str | None = None,
) -> Page[DecisionRecord]:
    """Decisions newest first, filtered; ``cursor``: the page after the one that handed
    it out. Without ``source``, every source but ``shadow``."""
    rows, count, exact, next_cursor = _decision_page(
        session,
        [DecisionRow.id, DecisionRow],
        job_id=job_id,
        source=source,
        since=since,
        limit=limit,
        offset=offset,
        cursor=cursor,
        policy_version=policy_version,
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
    DecisionRow.preempt,
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
    policy_version: str | None = None,
    tenant: str | None = None,
) -> Page[dict[str, Any]]:
    """``list_decisions`` as stored JSON, for the API's listing: only the columns it
    shows (not the explanation), and not rebuilt into dataclasses (they were valid
    decisions when written); about a third of the cost of ``list_decisions``.
    ``tenant``: only its jobs'."""
    rows, count, exact, next_cursor = _decision_page(
        session,
        _DECISION_COLUMNS,
        job_id=job_id,
        source=source,
        since=since,
        limit=limit,
        offset=offset,
        cursor=cursor,
        policy_version=policy_version,
        tenant=tenant,
    )
    return Page([row._asdict() for row in rows], count, exact, next_cursor)


def decision_counts(*, session: Session, after_id: int = 0) -> tuple[dict[str, int], int]:
    """Decisions per source with an id above ``after_id``, and the highest id counted
    (``after_id`` when there is none): callers keep a running total and count only what
    is new, so the cost follows the new rows, not the history."""
    if after_id == 0:  # the whole log: one pass over the (source, id) index
        rows = session.execute(
            select(DecisionRow.source, func.count(), func.max(DecisionRow.id)).group_by(
                DecisionRow.source
            )
        ).all()
        return {s: n for s, n, _ in rows}, max((top for *_, top in rows), default=after_id)
    # Only the new rows, by the primary key (a GROUP BY here would walk the source index
    # over the whole log).
    counts: dict[str, int] = {}
    top = after_id
    for decision_id, source in session.execute(
        select(DecisionRow.id, DecisionRow.source).where(DecisionRow.id > after_id)
    ):
        counts[source] = counts.get(source, 0) + 1
        top = max(top, decision_id)
    return counts, top


def latest_decision_records(
    *, session: Session, job_ids: Iterable[str] | None = None
) -> dict[str, DecisionRecord]:
    """The newest decision of every job (of ``job_ids``, when given), with its override;
    a shadow policy's decisions never count (they were not taken)."""
    newest = select(func.max(DecisionRow.id)).where(_TAKEN).group_by(DecisionRow.job_id)
    if job_ids is not None:
        newest = newest.where(DecisionRow.job_id.in_(list(job_ids)))
    rows = session.scalars(select(DecisionRow).where(DecisionRow.id.in_(newest)))
    return {row.job_id: _decision_record(row) for row in rows}


def latest_decisions(*, session: Session) -> dict[str, Decision]:
    """The newest decision taken for every job (shadow decisions never count)."""
    newest = select(func.max(DecisionRow.id)).where(_TAKEN).group_by(DecisionRow.job_id)
    rows = session.scalars(select(DecisionRow).where(DecisionRow.id.in_(newest)))
    return {row.job_id: _decision(row) for row in rows}


def running_placements(*, session: Session) -> dict[str, Placement]:
    """Where running jobs are: the placement of each running job's newest decision
    (shadow decisions never count)."""
    newest = (
        select(func.max(DecisionRow.id))
        .join(JobRow, JobRow.job_id == DecisionRow.job_id)
        .where(JobRow.state == "running", DecisionRow.placement.is_not(None), _TAKEN)
        .group_by(DecisionRow.job_id)
    )
    rows = session.scalars(select(DecisionRow).where(DecisionRow.id.in_(newest)))
    # A preemption's placement may be stored as JSON null, which ``is_not(None)`` keeps:
    # a job preempted by the tick while it still reads as running holds no GPUs.
    return {
        row.job_id: from_json(Placement, row.placement) for row in rows if row.placement is not None
    }
