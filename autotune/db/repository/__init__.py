"""Repository functions: the only way the daemon, the API and replay touch the tables.

Keyword-only, one session per call site (the caller owns the transaction), core types
in and out where one exists.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, func, insert, select, update
from sqlalchemy.orm import Session

from autotune.core import ACTIVE_STATES, JOB_STATES, utc_now
from autotune.db.repository.cursor import CursorError, decode_cursor, encode_cursor
from autotune.db.repository.decisions import (
    DecisionRecord,
    create_decision,
    create_decisions,
    decision_counts,
    get_decision,
    latest_decision_records,
    latest_decisions,
    list_decision_rows,
    list_decisions,
    mark_decision_applied,
    running_placements,
)
from autotune.db.repository.jobs import (
    JobRecord,
    active_jobs,
    cancel_requests,
    get_job,
    job_counts,
    job_ids,
    list_jobs,
    request_cancel,
    set_job_performance,
    set_job_state,
    submit_job,
    submitted_job_ids,
    upsert_job,
)
from autotune.db.repository.nodes import NodeRecord, list_nodes, node_records, upsert_nodes
from autotune.db.repository.observations import pack_observation, unpack_observation
from autotune.db.repository.overrides import (
    OverrideRecord,
    active_overrides,
    create_override,
    delete_override,
    get_override,
    list_overrides,
)
from autotune.db.repository.paging import COUNT_CAP, Page, bounded_count
from autotune.db.repository.policies import (
    POLICY_ACTIONS,
    PolicyConflictError,
    PolicyEventRecord,
    PolicyNotFoundError,
    PolicyVersionRecord,
    activate_policy,
    active_policy_version,
    clear_shadow_policy,
    get_policy_version,
    latest_policy_event,
    list_policy_events,
    list_policy_versions,
    policy_state,
    record_policy_failure,
    register_policy,
    register_policy_version,
    rollback_policy,
    set_shadow_policy,
)
from autotune.db.tables import ApiTokenRow, MetricRow, TransitionExportRow, TransitionRow

__all__ = [
    "ACTIVE_STATES",
    "COUNT_CAP",
    "JOB_STATES",
    "POLICY_ACTIONS",
    "CursorError",
    "DecisionRecord",
    "JobRecord",
    "MetricSample",
    "MetricSummary",
    "NodeRecord",
    "OverrideRecord",
    "Page",
    "PolicyConflictError",
    "PolicyEventRecord",
    "PolicyNotFoundError",
    "PolicyVersionRecord",
    "activate_policy",
    "active_jobs",
    "active_overrides",
    "active_policy_version",
    "add_token_hash",
    "cancel_requests",
    "clear_shadow_policy",
    "create_decision",
    "create_decisions",
    "create_override",
    "create_transition",
    "decision_counts",
    "decode_cursor",
    "delete_override",
    "encode_cursor",
    "get_decision",
    "get_job",
    "get_override",
    "get_policy_version",
    "job_counts",
    "job_ids",
    "latest_decision_records",
    "latest_decisions",
    "latest_policy_event",
    "list_decision_rows",
    "list_decisions",
    "list_jobs",
    "list_metric_samples",
    "list_metrics",
    "list_nodes",
    "list_overrides",
    "list_policy_events",
    "list_policy_versions",
    "mark_decision_applied",
    "node_records",
    "pack_observation",
    "pack_transition",
    "policy_state",
    "record_metrics",
    "record_policy_failure",
    "register_policy",
    "register_policy_version",
    "replace_token_hashes",
    "request_cancel",
    "rollback_policy",
    "running_placements",
    "set_job_performance",
    "set_job_state",
    "set_shadow_policy",
    "set_transition_reward",
    "submit_job",
    "submitted_job_ids",
    "summarize_metric",
    "token_hashes",
    "transition_payload",
    "truncate_open_transitions",
    "unpack_observation",
    "upsert_job",
    "upsert_nodes",
]


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
    episode: str,
    step: int,
    policy_version: str,
    epsilon: float,
    observation: bytes,
    slots: dict[str, Any],
    sim_time_s: float | None = None,
    at: datetime | None = None,
) -> int:
    """Log one decision round (``TransitionRow``); its reward comes later
    (``set_transition_reward``). ``at``: when it was decided (default now)."""
    row = TransitionRow(
        episode=episode,
        step=step,
        policy_version=policy_version,
        epsilon=epsilon,
        sim_time_s=sim_time_s,
        observation=observation,
        slots=slots,
        reward=None,
        reward_parts=None,
        truncated=False,
        created_at=at or utc_now(),
    )
    session.add(row)
    session.flush()
    return row.id


def set_transition_reward(
    *,
    session: Session,
    transition_id: int,
    reward: float | None,
    parts: dict[str, Any] | None,
    truncated: bool = False,
) -> None:
    """Fill in what the round after a logged decision produced; ``truncated``: the
    episode ends with this round."""
    session.execute(
        update(TransitionRow)
        .where(TransitionRow.id == transition_id)
        .values(reward=reward, reward_parts=parts, truncated=truncated)
    )


def pack_transition(slots: dict[str, Any], reward_parts: dict[str, Any] | None) -> bytes:
    """A logged round's JSON columns as a compacted row stores them (``TransitionRow.packed``)."""
    text = json.dumps({"slots": slots, "reward_parts": reward_parts}, separators=(",", ":"))
    return zlib.compress(text.encode(), 6)


def transition_payload(
    slots: dict[str, Any], reward_parts: dict[str, Any] | None, packed: bytes | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(slots, reward_parts)`` of a logged round, compacted or not."""
    if packed is None:
        return slots, reward_parts
    data = json.loads(zlib.decompress(packed))
    return data["slots"], data["reward_parts"]


def truncate_open_transitions(*, session: Session) -> int:
    """Mark every logged round still waiting for its reward as the end of its episode
    (the daemon stopped before measuring it); returns how many."""
    result = session.execute(
        update(TransitionRow)
        .where(TransitionRow.reward.is_(None), TransitionRow.truncated.is_(False))
        .values(truncated=True)
    )
    return int(getattr(result, "rowcount", 0) or 0)


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


def record_transition_export(
    *, session: Session, first_id: int, last_id: int, rounds: int, path: str
) -> None:
    """An export read the transitions ``first_id`` to ``last_id`` (every one between)."""
    session.add(
        TransitionExportRow(
            first_id=first_id, last_id=last_id, rounds=rounds, path=path, exported_at=utc_now()
        )
    )


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
