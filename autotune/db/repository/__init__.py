"""Repository functions: the only way the daemon, the API and replay touch the tables.

Keyword-only, one session per call site (the caller owns the transaction), core types
in and out where one exists.
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
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
from autotune.db.repository.metrics import (
    MetricSample,
    MetricSummary,
    job_metrics,
    latest_metric_samples,
    list_metric_samples,
    list_metrics,
    record_metrics,
    summarize_metric,
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
from autotune.db.repository.paging import COUNT_CAP, Page
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
from autotune.db.tables import ApiTokenRow, TransitionExportRow, TransitionRow

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
    "job_metrics",
    "latest_decision_records",
    "latest_decisions",
    "latest_metric_samples",
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
