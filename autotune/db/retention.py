"""Retention: bounded storage for a daemon that runs for months.

The daemon writes a few metric rows per job and per tick (every 1-2 s), decisions with
large JSON explanations, transitions and jobs. A ``RetentionPolicy`` says how long each
is kept; ``retention_step`` does one bounded piece of that work in one short
transaction, and ``run_retention`` repeats it until a step finds nothing to do.

A step touches at most ``batch_rows`` rows, all tables together (a decision, about a
page of explanation, counts as ``_DECISION_ROWS``). Rows are chosen by an indexed
``ORDER BY ... LIMIT`` and deleted by ``DELETE ... WHERE key IN (...)``. The step's reads
come before its first write, and on SQLite (WAL) only writes take the writer lock: the
lock is held for the writes and the commit, milliseconds, so the daemon's tick and the
API's readers never wait long behind retention. The work of a step, in order:

1. metrics downsampled: full-resolution samples older than ``metrics_full_days`` are
   folded into one row per (name, job_id, labels) and ``metrics_downsample_s`` bucket:
   ``value`` the mean, ``recorded_at`` the bucket's start (buckets are aligned to the
   epoch), ``labels`` the samples' labels plus ``downsampled_s`` (the bucket, seconds)
   and ``downsampled_n`` (how many samples it averages). The bucket's row is one of its
   samples' rows, rewritten (no insert), the others deleted. A bucket larger than a step
   is folded over several: each merges its samples into the bucket's row, weighted by
   ``downsampled_n``, so the mean stays exact. Rows carrying ``downsampled_s`` are never
   folded again. The averaging is done here in Python over a bounded slice of rows, the
   same on SQLite and PostgreSQL;
2. metrics older than ``metrics_days`` deleted, downsampled or not, and job events
   (``job_events``) older than ``decisions_days``;
3. transitions older than ``transitions_days`` deleted once an export covered them
   (``transition_exports``), and every transition older than
   ``transitions_unexported_days``; last in a step, those older than
   ``transitions_compact_days`` compacted: their JSON columns rewritten as one
   compressed blob, oldest first;
4. decisions older than ``decisions_days`` deleted, except the newest decision taken
   for every pending or running job (a shadow policy's decisions are never that one);
5. overrides that ended (``deleted_at`` or ``expires_at``) before ``decisions_days`` ago
   and that no decision refers to (an active override never; ``decisions.override_id``
   is indexed for this check and for the foreign key's);
6. jobs in a final state that finished before ``jobs_days`` ago deleted, once no decision
   and no override refers to them.

Where the next sample to fold is, is found without a marker column or a stored cursor:
samples are folded oldest first, so every downsampled row of the window is at most as
old as every sample left to fold, and a binary search over ``recorded_at`` (about 20
one-row index probes) finds the boundary. A sample written later with an old
``recorded_at`` (the daemon never does: it stamps samples now) breaks that order; such a
sample may then stay at full resolution until ``metrics_days`` deletes it.

Run one retention at a time per database (two at once could fold a sample twice).

The downsampling (step 1, and the search above) is ``autotune.db.downsampling``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from autotune.core import ACTIVE_STATES, JOB_STATES
from autotune.db import repository as repo
from autotune.db.downsampling import DOWNSAMPLED_N, DOWNSAMPLED_S, chunks, downsample, is_number
from autotune.db.engine import Database
from autotune.db.tables import (
    DecisionRow,
    JobEventRow,
    JobRow,
    MetricRow,
    OverrideRow,
    TransitionExportRow,
    TransitionRow,
)
from autotune.errors import InputError

__all__ = [
    "DOWNSAMPLED_N",
    "DOWNSAMPLED_S",
    "FINAL_STATES",
    "RetentionPolicy",
    "RetentionReport",
    "retention_step",
    "run_retention",
]

FINAL_STATES: tuple[str, ...] = tuple(s for s in JOB_STATES if s not in ACTIVE_STATES)

MAX_DAYS = 36_500.0
"""The longest finite retention (100 years); ``None`` keeps forever."""
_DECISION_ROWS = 4
"""A decision counts as this many rows of a step's budget: its explanation makes it
about a page (metric rows are tens of bytes), and deleting it rewrites that page."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """How long each kind of row is kept; ``None`` keeps it forever."""

    metrics_full_days: float | None = 1.0
    """Metric samples are kept at full resolution this long, then downsampled
    (``None``: never downsampled)."""
    metrics_downsample_s: float = 60.0
    """Older samples are averaged into one row per (name, job_id, labels) per bucket of
    this many seconds."""
    metrics_days: float | None = 30.0
    """Metric rows, downsampled or not, are deleted after this long."""
    decisions_days: float | None = 90.0
    """Decisions are deleted after this long (the newest of an active job never is);
    ended overrides too, once no decision refers to them, and job events."""
    transitions_days: float | None = 90.0
    """Logged transitions an export covered are deleted after this long."""
    transitions_unexported_days: float | None = 90.0
    """Those no export covered are kept this long (at least ``transitions_days``), so a
    replay window not exported yet outlives ``transitions_days``; ``None``: until
    exported."""
    transitions_compact_days: float | None = 1.0
    """Logged transitions older than this are compacted: their JSON columns stored as one
    compressed blob (``TransitionRow.packed``; ``None``: never)."""
    jobs_days: float | None = 90.0
    """Jobs that finished, failed or were cancelled this long ago are deleted, once no
    decision or override refers to them."""
    batch_rows: int = 2000
    """Rows one step deletes or folds at most, all tables together."""

    def __post_init__(self) -> None:
        for name in (
            "metrics_full_days",
            "metrics_days",
            "decisions_days",
            "transitions_days",
            "transitions_unexported_days",
            "transitions_compact_days",
            "jobs_days",
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if not is_number(value) or not math.isfinite(value) or value <= 0:
                raise InputError(
                    f"retention {name}={value!r}: must be a positive number of days "
                    "(None keeps forever)"
                )
            if value > MAX_DAYS:
                raise InputError(
                    f"retention {name}={value!r}: at most {MAX_DAYS:g} days (None keeps forever)"
                )
        s = self.metrics_downsample_s
        if not is_number(s) or not math.isfinite(s) or s < 1:
            raise InputError(
                f"retention metrics_downsample_s={s!r}: must be a number of seconds, at least 1"
            )
        if (
            self.metrics_full_days is not None
            and self.metrics_days is not None
            and self.metrics_full_days >= self.metrics_days
        ):
            raise InputError(
                f"retention metrics_full_days={self.metrics_full_days!r} must be less than "
                f"metrics_days={self.metrics_days!r} (samples are downsampled before they "
                "are deleted)"
            )
        b = self.batch_rows
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise InputError(f"retention batch_rows={b!r}: must be a positive whole number")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionReport:
    """What one step, or a whole run, did."""

    metrics_downsampled: int = 0
    """Full-resolution metric samples folded into downsampled rows (each one deleted, or
    rewritten as its bucket's downsampled row)."""
    metrics_written: int = 0
    """Downsampled rows written (a sample's row rewritten, or a bucket's row updated with
    more samples): the metrics table shrank by ``metrics_downsampled - metrics_written``."""
    metrics_deleted: int = 0
    """Metric rows older than ``metrics_days`` deleted."""
    job_events_deleted: int = 0
    """Job events older than ``decisions_days`` deleted."""
    transitions_deleted: int = 0
    transitions_compacted: int = 0
    """Logged transitions rewritten compacted (not deleted)."""
    decisions_deleted: int = 0
    overrides_deleted: int = 0
    jobs_deleted: int = 0
    steps: int = 0
    done: bool = False
    """The (last) step found nothing to do for this ``now``."""
    elapsed_s: float = 0.0
    max_step_s: float = 0.0
    """The longest step (its whole transaction, reads included)."""

    @property
    def deleted(self) -> dict[str, int]:
        """Rows deleted per table: past their age, or folded into a downsampled row."""
        return {
            "metrics": self.metrics_deleted + self.metrics_downsampled - self.metrics_written,
            "job_events": self.job_events_deleted,
            "transitions": self.transitions_deleted,
            "decisions": self.decisions_deleted,
            "overrides": self.overrides_deleted,
            "jobs": self.jobs_deleted,
        }

    @property
    def rows_touched(self) -> int:
        """Rows deleted or folded: a step touches at most ``batch_rows``."""
        return (
            self.metrics_downsampled
            + self.metrics_deleted
            + self.job_events_deleted
            + self.transitions_deleted
            + self.transitions_compacted
            + self.decisions_deleted
            + self.overrides_deleted
            + self.jobs_deleted
        )

    def __add__(self, other: RetentionReport) -> RetentionReport:
        """The two reports of consecutive work: counts summed, ``done`` the later's."""
        summed: dict[str, Any] = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in ("done", "max_step_s")
        }
        return RetentionReport(
            **summed, done=other.done, max_step_s=max(self.max_step_s, other.max_step_s)
        )


def retention_step(db: Database, policy: RetentionPolicy, now: datetime) -> RetentionReport:
    """One bounded piece of the retention work for ``now``, in one transaction: at most
    ``policy.batch_rows`` rows deleted or folded. ``done`` when the step found nothing
    left to do (so a run ends with one step that does nothing: work one phase does can
    make more for another, an override deletable once its decisions are gone)."""
    if now.tzinfo is None:
        raise ValueError(f"naive datetime {now!r}: retention needs a UTC-aware now")
    started = time.perf_counter()
    counts: dict[str, int] = {}
    budget = policy.batch_rows
    with db.session() as session:
        for phase in _PHASES:
            if budget <= 0:
                break
            result = phase(session, policy, now, budget)
            for key, n in result.counts.items():
                counts[key] = counts.get(key, 0) + n
            budget -= result.touched
    elapsed = time.perf_counter() - started
    done = budget == policy.batch_rows
    return RetentionReport(**counts, steps=1, done=done, elapsed_s=elapsed, max_step_s=elapsed)


def run_retention(
    db: Database,
    policy: RetentionPolicy,
    now: datetime,
    *,
    pause_s: float = 0.0,
    duty: float = 1.0,
    should_stop: Callable[[], bool] | None = None,
) -> RetentionReport:
    """``retention_step`` until it is done, or until ``should_stop()`` says so (checked
    before each step; then ``done`` is false). Returns the steps' reports summed.

    Between steps it pauses ``pause_s`` seconds, and longer where needed to spend at most
    the share ``duty`` of the time in steps (0.2: a 20 ms step is followed by 80 ms of
    rest), so that other writers get the database and, in the daemon's process, the
    decision loop and the API get the interpreter."""
    if not 0 < duty <= 1:
        raise InputError(f"retention duty={duty!r}: must be in (0, 1]")
    total = RetentionReport()
    while True:
        if should_stop is not None and should_stop():
            return total
        step = retention_step(db, policy, now)
        total = total + step
        if total.done:
            return total
        rest = max(pause_s, step.elapsed_s * (1 / duty - 1))
        if rest > 0:
            time.sleep(rest)


# --- phases ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Phase:
    touched: int
    """The step's budget used: rows deleted or folded (a decision counts as
    ``_DECISION_ROWS``)."""
    counts: dict[str, int]


def _delete_by_key(
    session: Session, column: InstrumentedAttribute[Any], keys: Sequence[Any]
) -> None:
    for chunk in chunks(keys):
        session.execute(
            delete(column.class_).where(column.in_(chunk)),
            execution_options={"synchronize_session": False},
        )


def _ago(now: datetime, days: float) -> datetime:
    return now - timedelta(days=days)


def _delete_oldest(
    session: Session,
    key: InstrumentedAttribute[Any],
    stamp: InstrumentedAttribute[datetime],
    cutoff: datetime,
    budget: int,
) -> int:
    """Delete up to ``budget`` rows stamped before ``cutoff``, oldest first (one index
    range); returns how many."""
    ids = list(session.scalars(select(key).where(stamp < cutoff).order_by(stamp).limit(budget)))
    _delete_by_key(session, key, ids)
    return len(ids)


def _old_metrics(session: Session, policy: RetentionPolicy, now: datetime, budget: int) -> _Phase:
    if policy.metrics_days is None:
        return _Phase(0, {})
    cutoff = _ago(now, policy.metrics_days)
    n = _delete_oldest(session, MetricRow.id, MetricRow.recorded_at, cutoff, budget)
    return _Phase(n, {"metrics_deleted": n})


def _old_job_events(
    session: Session, policy: RetentionPolicy, now: datetime, budget: int
) -> _Phase:
    if policy.decisions_days is None:  # kept as long as the decisions
        return _Phase(0, {})
    cutoff = _ago(now, policy.decisions_days)
    n = _delete_oldest(session, JobEventRow.id, JobEventRow.at, cutoff, budget)
    return _Phase(n, {"job_events_deleted": n})


def _old_transitions(
    session: Session, policy: RetentionPolicy, now: datetime, budget: int
) -> _Phase:
    if policy.transitions_days is None:  # kept forever, exported or not
        return _Phase(0, {})
    n = 0
    if policy.transitions_unexported_days is not None:  # exported or not
        cutoff = _ago(now, max(policy.transitions_unexported_days, policy.transitions_days))
        n = _delete_oldest(session, TransitionRow.id, TransitionRow.created_at, cutoff, budget)
    if n < budget:
        n += _delete_exported(session, _ago(now, policy.transitions_days), budget - n)
    return _Phase(n, {"transitions_deleted": n})


def _delete_exported(session: Session, cutoff: datetime, budget: int) -> int:
    """Delete up to ``budget`` transitions logged before ``cutoff`` that an export
    covered: per export, a primary-key range (ids grow with time, so the ones before
    ``cutoff`` are those up to the newest such id)."""
    old_top = session.scalar(
        select(TransitionRow.id)
        .where(TransitionRow.created_at < cutoff)
        .order_by(TransitionRow.created_at.desc())
        .limit(1)
    )
    if old_top is None:
        return 0
    n = 0
    ranges = session.execute(
        select(TransitionExportRow.first_id, TransitionExportRow.last_id)
        .where(TransitionExportRow.first_id <= old_top)
        .order_by(TransitionExportRow.first_id)
    ).all()
    for first_id, last_id in ranges:
        if n >= budget:
            break
        ids = list(
            session.scalars(
                select(TransitionRow.id)
                .where(
                    TransitionRow.id >= first_id,
                    TransitionRow.id <= min(last_id, old_top),
                    TransitionRow.created_at < cutoff,
                )
                .order_by(TransitionRow.id)
                .limit(budget - n)
            )
        )
        _delete_by_key(session, TransitionRow.id, ids)
        n += len(ids)
    return n


def _first_uncompacted(session: Session) -> int | None:
    """The smallest id of a transition not yet compacted. Rows are compacted oldest (by
    id) first, so the compacted ones are a prefix of the table: a binary search of about
    20 primary-key probes finds its end, with no index on ``packed``."""
    low = session.scalar(select(func.min(TransitionRow.id)))
    top = session.scalar(select(func.max(TransitionRow.id)))
    if low is None or top is None:
        return None
    high = top + 1  # the first uncompacted id is in [low, high]
    while low < high:
        mid = (low + high) // 2
        row = session.execute(
            select(TransitionRow.id, TransitionRow.packed)
            .where(TransitionRow.id >= mid)
            .order_by(TransitionRow.id)
            .limit(1)
        ).first()
        if row is None or row.id >= high:  # no row in [mid, high)
            high = mid
        elif row.packed is not None:
            low = row.id + 1
        else:
            high = row.id
    return session.scalar(
        select(TransitionRow.id)
        .where(TransitionRow.id >= low, TransitionRow.packed.is_(None))
        .order_by(TransitionRow.id)
        .limit(1)
    )


def _compact_transitions(
    session: Session, policy: RetentionPolicy, now: datetime, budget: int
) -> _Phase:
    if policy.transitions_compact_days is None:
        return _Phase(0, {})
    start = _first_uncompacted(session)
    if start is None:
        return _Phase(0, {})
    cutoff = _ago(now, policy.transitions_compact_days)
    rows = session.execute(
        select(TransitionRow.id, TransitionRow.slots, TransitionRow.reward_parts)
        .where(
            TransitionRow.id >= start,
            TransitionRow.created_at < cutoff,
            TransitionRow.packed.is_(None),
        )
        .order_by(TransitionRow.id)
        .limit(budget)
    ).all()
    if not rows:
        return _Phase(0, {})
    table = cast(Table, TransitionRow.__table__)
    session.execute(
        update(table)
        .where(table.c.id == bindparam("row_id"))
        .values(packed=bindparam("packed"), slots={}, reward_parts=None),
        [{"row_id": r.id, "packed": repo.pack_transition(r.slots, r.reward_parts)} for r in rows],
    )
    return _Phase(len(rows), {"transitions_compacted": len(rows)})


def _old_decisions(session: Session, policy: RetentionPolicy, now: datetime, budget: int) -> _Phase:
    if policy.decisions_days is None:
        return _Phase(0, {})
    cutoff = _ago(now, policy.decisions_days)
    # The newest decision taken for each active job (a shadow policy's never counts): one
    # index range per job, read from its newest end.
    newest = (
        select(func.max(DecisionRow.id))
        .where(DecisionRow.job_id == JobRow.job_id, DecisionRow.source != "shadow")
        .scalar_subquery()
    )
    keep = {
        i
        for i in session.scalars(select(newest).where(JobRow.state.in_(ACTIVE_STATES)))
        if i is not None
    }
    wanted = max(1, budget // _DECISION_ROWS)
    limit = wanted + len(keep)
    old = list(
        session.scalars(
            select(DecisionRow.id)
            .where(DecisionRow.decided_at < cutoff)
            .order_by(DecisionRow.decided_at, DecisionRow.id)
            .limit(limit)
        )
    )
    deletable = [i for i in old if i not in keep]
    ids = deletable[:wanted]
    _delete_by_key(session, DecisionRow.id, ids)
    return _Phase(len(ids) * _DECISION_ROWS, {"decisions_deleted": len(ids)})


def _ended_overrides(
    session: Session, policy: RetentionPolicy, now: datetime, budget: int
) -> _Phase:
    if policy.decisions_days is None:
        return _Phase(0, {})
    cutoff = _ago(now, policy.decisions_days)
    # A decision refers to an override of its own job: the check by job uses the
    # decisions' (job_id, id) index; the exact check below reads only the candidates.
    referenced_by_job = (
        select(DecisionRow.id)
        .where(DecisionRow.job_id == OverrideRow.job_id, DecisionRow.override_id == OverrideRow.id)
        .exists()
    )
    candidates = list(
        session.scalars(
            select(OverrideRow.id)
            .where(
                or_(OverrideRow.deleted_at < cutoff, OverrideRow.expires_at < cutoff),
                ~referenced_by_job,
            )
            .order_by(OverrideRow.id)
            .limit(budget)
        )
    )
    if not candidates:
        return _Phase(0, {})
    referenced = set(
        session.scalars(
            select(DecisionRow.override_id)
            .where(DecisionRow.override_id.in_(candidates))
            .distinct()
        )
    )
    ids = [i for i in candidates if i not in referenced]
    _delete_by_key(session, OverrideRow.id, ids)
    return _Phase(len(ids), {"overrides_deleted": len(ids)})


def _final_jobs(session: Session, policy: RetentionPolicy, now: datetime, budget: int) -> _Phase:
    if policy.jobs_days is None:
        return _Phase(0, {})
    cutoff = _ago(now, policy.jobs_days)
    has_decision = select(DecisionRow.id).where(DecisionRow.job_id == JobRow.job_id).exists()
    has_override = select(OverrideRow.id).where(OverrideRow.job_id == JobRow.job_id).exists()
    ids = list(
        session.scalars(
            select(JobRow.job_id)
            .where(
                JobRow.state.in_(FINAL_STATES),
                # Submitted before it finished: bounds the (state, submitted_at) index range.
                JobRow.submitted_at < cutoff,
                func.coalesce(JobRow.finished_at, JobRow.updated_at) < cutoff,
                ~has_decision,
                ~has_override,
            )
            .order_by(JobRow.submitted_at, JobRow.job_id)
            .limit(budget)
        )
    )
    _delete_by_key(session, JobRow.job_id, ids)
    return _Phase(len(ids), {"jobs_deleted": len(ids)})


def _downsample(session: Session, policy: RetentionPolicy, now: datetime, budget: int) -> _Phase:
    if policy.metrics_full_days is None:
        return _Phase(0, {})
    folded, written = downsample(
        session,
        full_before=_ago(now, policy.metrics_full_days),
        deleted_before=None if policy.metrics_days is None else _ago(now, policy.metrics_days),
        bucket_s=float(policy.metrics_downsample_s),
        budget=budget,
    )
    if not folded:
        return _Phase(0, {})
    return _Phase(folded, {"metrics_downsampled": folded, "metrics_written": written})


_PHASES: tuple[Callable[[Session, RetentionPolicy, datetime, int], _Phase], ...] = (
    # Downsampling first: its reads, the largest, come before any write of the step.
    _downsample,
    _old_metrics,
    _old_job_events,
    _old_transitions,
    # Then what refers to what, so one step can clear a chain: decisions, the overrides
    # they referred to, the jobs both referred to (foreign keys).
    _old_decisions,
    _ended_overrides,
    _final_jobs,
    # Rewrites, not deletions: last, and only what the deletions left.
    _compact_transitions,
)
