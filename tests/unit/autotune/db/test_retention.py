"""Retention: old metrics downsampled then deleted, old decisions, overrides, transitions
and jobs deleted in bounded steps; on SQLite and, where one is at hand, on PostgreSQL
(``any_database``, see conftest)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, update

from autotune.core import Decision, JobConfig, JobSpec, JobState
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.retention import (
    DOWNSAMPLED_N,
    DOWNSAMPLED_S,
    RetentionPolicy,
    RetentionReport,
    retention_step,
    run_retention,
)
from autotune.db.tables import (
    DecisionRow,
    JobRow,
    MetricRow,
    OverrideRow,
    TransitionRow,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)
"""A fixed now, on a whole minute (buckets of 60 s are aligned to the epoch)."""

KEEP_ALL = RetentionPolicy(
    metrics_full_days=None,
    metrics_days=None,
    decisions_days=None,
    transitions_days=None,
    transitions_compact_days=None,
    jobs_days=None,
)

Sample = tuple[str, float, str | None, dict[str, Any], datetime]


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


def add_samples(database: Database, samples: Iterable[Sample]) -> None:
    with database.session() as session:
        for name, value, job_id, labels, at in samples:
            repo.record_metrics(
                session=session, values=[(name, value, job_id)], labels=labels, at=at
            )


def metric_rows(database: Database) -> list[tuple[str, str | None, str, datetime, float]]:
    """Every metric row as (name, job_id, labels, recorded_at, value), sorted."""
    with database.session() as session:
        rows = session.execute(
            select(
                MetricRow.name,
                MetricRow.job_id,
                MetricRow.labels,
                MetricRow.recorded_at,
                MetricRow.value,
            )
        ).all()
    return sorted(
        (name, job_id, json.dumps(labels, sort_keys=True), at, value)
        for name, job_id, labels, at, value in rows
    )


def table_snapshot(database: Database) -> dict[str, list[tuple[Any, ...]]]:
    tables: dict[str, Any] = {
        "metrics": MetricRow,
        "decisions": DecisionRow,
        "overrides": OverrideRow,
        "jobs": JobRow,
        "transitions": TransitionRow,
    }
    snapshot: dict[str, list[tuple[Any, ...]]] = {}
    with database.engine.connect() as connection:
        for name, model in tables.items():
            table = model.__table__
            rows = connection.execute(select(table).order_by(*table.primary_key.columns)).all()
            snapshot[name] = [tuple(row) for row in rows]
    return snapshot


def expected_metric_rows(
    samples: Iterable[Sample], policy: RetentionPolicy, now: datetime
) -> list[tuple[str, str | None, str, datetime, float]]:
    """What retention should leave of ``samples``, worked out directly."""
    s = policy.metrics_downsample_s
    assert policy.metrics_full_days is not None
    full_end = (now - timedelta(days=policy.metrics_full_days)).timestamp()
    full_end = math.floor(full_end / s) * s
    deleted_before = (
        None if policy.metrics_days is None else now - timedelta(days=policy.metrics_days)
    )
    start = -math.inf if deleted_before is None else math.ceil(deleted_before.timestamp() / s) * s
    kept = []
    buckets: dict[tuple[str, str | None, str, float], list[float]] = {}
    for name, value, job_id, labels, at in samples:
        if deleted_before is not None and at < deleted_before:
            continue
        if start <= at.timestamp() < full_end:
            key = (name, job_id, json.dumps(labels, sort_keys=True), at.timestamp() // s * s)
            buckets.setdefault(key, []).append(value)
        else:
            kept.append((name, job_id, json.dumps(labels, sort_keys=True), at, value))
    for (name, job_id, labels_key, bucket), values in buckets.items():
        labels = {
            **json.loads(labels_key),
            DOWNSAMPLED_S: int(s) if float(s).is_integer() else s,
            DOWNSAMPLED_N: len(values),
        }
        at = datetime.fromtimestamp(bucket, UTC)
        kept.append(
            (name, job_id, json.dumps(labels, sort_keys=True), at, sum(values) / len(values))
        )
    return sorted(kept)


def assert_same_rows(actual: list[Any], expected: list[Any]) -> None:
    assert [row[:4] for row in actual] == [row[:4] for row in expected]
    assert [row[4] for row in actual] == pytest.approx([row[4] for row in expected], rel=1e-12)


def history() -> list[Sample]:
    """Two buckets (5 days ago) of three series, six samples a bucket each, a sample
    on a bucket's start, recent samples and samples older than 30 days."""
    b1 = ago(days=5)
    samples: list[Sample] = []
    for i in range(12):  # every 10 s from b1: two whole buckets
        at = b1 + timedelta(seconds=10 * i)
        samples.append(("gpu_utilization", float(i), None, {"backend": "sim"}, at))
        samples.append(("gpu_utilization", 100.0 + i, None, {"backend": "other"}, at))
        samples.append(("job_goodput", 2.0 * i, "j1", {"backend": "sim"}, at))
    samples.append(("gpu_utilization", 7.0, None, {"backend": "sim"}, ago(days=1, seconds=10)))
    samples.append(
        ("gpu_utilization", 8.0, None, {"backend": "sim"}, ago(days=1) + timedelta(seconds=5))
    )
    samples.extend(
        ("gpu_utilization", 0.5, None, {"backend": "sim"}, ago(hours=1, seconds=i))
        for i in range(3)
    )
    samples.append(("gpu_utilization", 9.0, None, {"backend": "sim"}, ago(days=31)))
    samples.append(("job_goodput", 9.0, "j0", {"backend": "sim"}, ago(days=40, seconds=3)))
    return samples


def test_old_metrics_are_averaged_per_bucket_and_series(any_database: Database) -> None:
    database = any_database
    samples = history()
    add_samples(database, samples)
    recent_before = [r for r in metric_rows(database) if r[3] >= ago(days=1)]

    report = run_retention(database, RetentionPolicy(), NOW)

    assert report.done
    assert report.metrics_downsampled == 12 * 3 + 1
    assert report.metrics_written == 2 * 3 + 1
    assert report.metrics_deleted == 2
    rows = metric_rows(database)
    b1, b2 = ago(days=5), ago(days=5) + timedelta(minutes=1)
    sim = {"backend": "sim", DOWNSAMPLED_S: 60, DOWNSAMPLED_N: 6}
    other = {"backend": "other", DOWNSAMPLED_S: 60, DOWNSAMPLED_N: 6}
    downsampled = [r for r in rows if DOWNSAMPLED_S in r[2]]
    assert downsampled == sorted(
        [
            ("gpu_utilization", None, json.dumps(sim, sort_keys=True), b1, 2.5),
            ("gpu_utilization", None, json.dumps(sim, sort_keys=True), b2, 8.5),
            ("gpu_utilization", None, json.dumps(other, sort_keys=True), b1, 102.5),
            ("gpu_utilization", None, json.dumps(other, sort_keys=True), b2, 108.5),
            ("job_goodput", "j1", json.dumps(sim, sort_keys=True), b1, 5.0),
            ("job_goodput", "j1", json.dumps(sim, sort_keys=True), b2, 17.0),
            (
                "gpu_utilization",
                None,
                json.dumps({**sim, DOWNSAMPLED_N: 1}, sort_keys=True),
                ago(days=1, minutes=1),
                7.0,
            ),
        ]
    )
    # Full resolution for the last day, untouched; nothing older than 30 days.
    assert [r for r in rows if DOWNSAMPLED_S not in r[2]] == recent_before
    assert len(recent_before) == 4
    assert all(r[3] >= ago(days=30) for r in rows)
    assert_same_rows(rows, expected_metric_rows(samples, RetentionPolicy(), NOW))


def test_a_series_is_its_labels_whatever_their_order(any_database: Database) -> None:
    database = any_database
    at = ago(days=3)
    add_samples(
        database,
        [
            ("gpu_utilization", 1.0, None, {"a": 1, "b": "x"}, at),
            ("gpu_utilization", 2.0, None, {"b": "x", "a": 1}, at + timedelta(seconds=20)),
            ("gpu_utilization", 6.0, None, {"a": 2, "b": "x"}, at + timedelta(seconds=30)),
        ],
    )
    report = run_retention(database, RetentionPolicy(), NOW)
    assert (report.metrics_downsampled, report.metrics_written) == (3, 2)
    rows = metric_rows(database)
    assert [(json.loads(r[2]), r[3], r[4]) for r in rows] == [
        ({"a": 1, "b": "x", DOWNSAMPLED_S: 60, DOWNSAMPLED_N: 2}, at, 1.5),
        ({"a": 2, "b": "x", DOWNSAMPLED_S: 60, DOWNSAMPLED_N: 1}, at, 6.0),
    ]


def test_downsampled_rows_are_deleted_after_metrics_days(any_database: Database) -> None:
    database = any_database
    add_samples(database, history())
    run_retention(database, RetentionPolicy(), NOW)
    later = NOW + timedelta(days=26)  # the buckets of 5 days ago are now 31 days old
    report = run_retention(database, RetentionPolicy(), later)
    assert report.done
    assert report.metrics_deleted == 6
    assert all(r[3] >= later - timedelta(days=30) for r in metric_rows(database))


def test_each_step_removes_at_most_batch_rows_and_folds_big_buckets_exactly(
    any_database: Database,
) -> None:
    database = any_database
    samples = history()
    add_samples(database, samples)
    policy = RetentionPolicy(batch_rows=4)  # smaller than a bucket (18 samples)
    steps: list[RetentionReport] = []
    while not (steps and steps[-1].done):
        steps.append(retention_step(database, policy, NOW))
        assert len(steps) < 100
    assert all(step.rows_touched <= 4 for step in steps)
    assert all(step.metrics_written <= step.metrics_downsampled for step in steps)
    assert sum(step.metrics_downsampled for step in steps) == 37
    # Full steps until the last with work, then one that finds nothing to do.
    assert all(step.rows_touched == 4 for step in steps[:-2])
    assert steps[-1].rows_touched == 0
    assert not any(step.done for step in steps[:-1])
    assert_same_rows(metric_rows(database), expected_metric_rows(samples, policy, NOW))


def test_later_runs_fold_only_new_samples_and_never_refold(any_database: Database) -> None:
    database = any_database
    samples = history()
    add_samples(database, samples)
    run_retention(database, RetentionPolicy(batch_rows=5), NOW)
    newer: list[Sample] = [
        ("gpu_utilization", float(v), None, {"backend": "sim"}, ago(hours=v)) for v in (2, 3, 12)
    ]
    add_samples(database, newer)
    later = NOW + timedelta(days=1)
    report = run_retention(database, RetentionPolicy(batch_rows=5), later)
    assert report.done
    # The 4 last-day samples of before, the 3 new ones, none of the downsampled rows.
    assert report.metrics_downsampled == 4 + 3
    assert_same_rows(
        metric_rows(database),
        expected_metric_rows(samples + newer, RetentionPolicy(), later),
    )


def test_the_search_starts_folding_next_to_the_oldest_sample_left(
    any_database: Database,
) -> None:
    from autotune.db.downsampling import _fold_start, _LabelCache

    database = any_database
    add_samples(database, history())
    run_retention(database, RetentionPolicy(), NOW)
    later = NOW + timedelta(days=1)
    start, end = later - timedelta(days=30), NOW  # the window at ``later``
    with database.session() as session:
        at = _fold_start(session, start, end, 60.0, _LabelCache())
    # Past every downsampled row but the newest bucket's, not after the oldest sample.
    assert at is not None
    assert ago(days=1, minutes=1) <= at <= ago(days=1) + timedelta(seconds=5)


def test_a_second_run_finds_nothing_to_do(any_database: Database) -> None:
    database = any_database
    add_samples(database, history())
    populate_decisions(database)
    first = run_retention(database, RetentionPolicy(batch_rows=3), NOW)
    assert first.done
    assert first.steps > 1
    before = table_snapshot(database)
    again = run_retention(database, RetentionPolicy(batch_rows=3), NOW)
    assert again == RetentionReport(
        steps=1, done=True, elapsed_s=again.elapsed_s, max_step_s=again.max_step_s
    )
    assert table_snapshot(database) == before


# --- decisions, overrides, jobs, transitions ------------------------------------------


def decision(job_id: str, at: datetime) -> Decision:
    return Decision(
        job_id=job_id,
        config=JobConfig.data_parallel(1),
        placement=None,
        source="policy",
        policy_version="rules-test",
        reason="test",
        decided_at=at,
    )


def add_job(
    database: Database,
    job_id: str,
    state: JobState,
    *,
    submitted: datetime,
    finished: datetime | None = None,
) -> None:
    with database.session() as session:
        repo.upsert_job(session=session, spec=JobSpec(job_id=job_id), state=state)
        session.flush()
        session.execute(
            update(JobRow)
            .where(JobRow.job_id == job_id)
            .values(
                submitted_at=submitted,
                updated_at=finished or submitted,
                started_at=None if state == "pending" else submitted,
                finished_at=finished,
            )
        )


def add_override(
    database: Database,
    job_id: str,
    *,
    created: datetime,
    expires: datetime,
    deleted: datetime | None,
) -> int:
    with database.session() as session:
        record = repo.create_override(
            session=session, job_id=job_id, pin={"compression": {}}, reason="t", expires_at=expires
        )
        session.execute(
            update(OverrideRow)
            .where(OverrideRow.id == record.override_id)
            .values(created_at=created, deleted_at=deleted)
        )
    return record.override_id


def add_decisions(
    database: Database, job_id: str, times: Iterable[datetime], override_id: int | None = None
) -> list[int]:
    with database.session() as session:
        stored = repo.create_decisions(
            session=session,
            decisions=[(decision(job_id, at), override_id, {"big": "x" * 200}) for at in times],
        )
    return [d.decision_id for d in stored if d.decision_id is not None]


def add_transition(database: Database, at: datetime) -> int:
    with database.session() as session:
        tid = repo.create_transition(
            session=session,
            episode="run-0000",
            step=int(at.timestamp()),
            policy_version="v",
            epsilon=0.0,
            observation=repo.pack_observation(np.ones(2), 2),
            slots={"jobs": [], "running": [], "entries": [], "mask": [], "logp": [], "applied": []},
        )
        session.execute(update(TransitionRow).where(TransitionRow.id == tid).values(created_at=at))
    return tid


def populate_decisions(database: Database) -> dict[str, Any]:
    """Jobs, decisions, overrides and transitions around the 90-day cutoff."""
    ids: dict[str, Any] = {}
    add_job(database, "active", "running", submitted=ago(days=120))
    # Ended long ago and referred to by no decision: goes.
    ids["o_unused"] = add_override(
        database, "active", created=ago(days=119), expires=ago(days=100), deleted=None
    )
    # Ended long ago, but the active job's newest decision (kept) refers to it: stays.
    ids["o_kept"] = add_override(
        database, "active", created=ago(days=99), expires=ago(days=96), deleted=ago(days=97)
    )
    ids["active_old"] = add_decisions(database, "active", [ago(days=110), ago(days=100)])
    ids["active_newest"] = add_decisions(database, "active", [ago(days=98)], ids["o_kept"])

    add_job(database, "old-done", "finished", submitted=ago(days=130), finished=ago(days=100))
    ids["o_old_done"] = add_override(
        database, "old-done", created=ago(days=125), expires=ago(days=99), deleted=None
    )
    ids["old_done"] = add_decisions(
        database, "old-done", [ago(days=125), ago(days=110)], ids["o_old_done"]
    )

    add_job(database, "old-failed", "failed", submitted=ago(days=200), finished=ago(days=199))

    add_job(database, "recent-done", "cancelled", submitted=ago(days=120), finished=ago(days=10))
    ids["recent_done"] = add_decisions(database, "recent-done", [ago(days=100)])

    add_job(database, "done-kept", "finished", submitted=ago(days=120), finished=ago(days=95))
    ids["done_kept"] = add_decisions(database, "done-kept", [ago(days=95), ago(days=80)])

    add_job(database, "old-pending", "pending", submitted=ago(days=150))
    ids["old_pending"] = add_decisions(database, "old-pending", [ago(days=149), ago(days=140)])

    add_job(database, "pinned", "finished", submitted=ago(days=150), finished=ago(days=140))
    ids["o_active"] = add_override(
        database, "pinned", created=ago(days=150), expires=NOW + timedelta(days=1), deleted=None
    )
    ids["transitions"] = [add_transition(database, ago(days=d)) for d in (120, 91, 89, 1)]
    return ids


def remaining(database: Database) -> dict[str, set[Any]]:
    with database.session() as session:
        return {
            "jobs": set(session.scalars(select(JobRow.job_id))),
            "decisions": set(session.scalars(select(DecisionRow.id))),
            "overrides": set(session.scalars(select(OverrideRow.id))),
            "transitions": set(session.scalars(select(TransitionRow.id))),
        }


@pytest.mark.parametrize("batch_rows", [2000, 1])
def test_old_decisions_overrides_jobs_and_transitions_go(
    any_database: Database, batch_rows: int
) -> None:
    database = any_database
    ids = populate_decisions(database)
    report = run_retention(database, RetentionPolicy(batch_rows=batch_rows), NOW)
    assert report.done
    left = remaining(database)
    assert left["jobs"] == {"active", "recent-done", "done-kept", "old-pending", "pinned"}
    assert left["decisions"] == {
        *ids["active_newest"],  # the newest of a running job, though 98 days old
        ids["done_kept"][1],  # 80 days old
        ids["old_pending"][1],  # the newest of a pending job
    }
    assert left["overrides"] == {ids["o_kept"], ids["o_active"]}
    assert left["transitions"] == set(ids["transitions"][2:])
    assert report.deleted == {
        "metrics": 0,
        "job_events": 0,
        "transitions": 2,
        "decisions": 7,
        "overrides": 2,
        "jobs": 2,
    }
    if batch_rows == 1:
        assert report.steps >= report.rows_touched
        assert report.max_step_s > 0


@pytest.mark.parametrize("batch_rows", [2000, 1])
def test_transitions_an_export_covered_go_after_transitions_days_the_others_later(
    any_database: Database, batch_rows: int
) -> None:
    database = any_database
    t = {d: add_transition(database, ago(days=d)) for d in (100, 60, 50, 40, 35, 20, 1)}
    with database.session() as session:  # two exports: days 60 to 40, and 20 to 1
        repo.record_transition_export(
            session=session, first_id=t[60], last_id=t[40], rounds=3, path="/e/1"
        )
        repo.record_transition_export(
            session=session, first_id=t[20], last_id=t[1], rounds=2, path="/e/2"
        )
    policy = RetentionPolicy(
        transitions_days=30, transitions_unexported_days=90, batch_rows=batch_rows
    )
    report = run_retention(database, policy, NOW)
    assert report.done
    left = remaining(database)["transitions"]
    # 100 days: past the unexported limit; 60-40: exported and past 30 days. 35 days was
    # never exported: it stays until 90; 20 and 1: exported but younger than 30 days.
    assert left == {t[35], t[20], t[1]}
    assert report.deleted["transitions"] == 4
    later = run_retention(database, policy, NOW + timedelta(days=60))
    assert later.deleted["transitions"] == 3  # 35 days + 60 > 90; 20 and 1 now past 30
    forever = RetentionPolicy(transitions_days=None, transitions_unexported_days=90)
    add_transition(database, ago(days=500))
    assert run_retention(database, forever, NOW).deleted["transitions"] == 0


def test_steps_stay_within_their_budget_on_every_table(any_database: Database) -> None:
    database = any_database
    add_samples(database, history())
    ids = populate_decisions(database)
    policy = RetentionPolicy(batch_rows=8)
    steps: list[RetentionReport] = []
    while not (steps and steps[-1].done):
        steps.append(retention_step(database, policy, NOW))
        assert len(steps) < 100
    assert all(step.rows_touched <= 8 for step in steps)
    # A decision, about a page of explanation, counts as 4 rows of the budget.
    assert all(step.decisions_deleted <= 2 for step in steps)
    assert all(step.overrides_deleted <= 8 for step in steps)
    assert sum(step.decisions_deleted for step in steps) == 7
    assert remaining(database)["overrides"] == {ids["o_kept"], ids["o_active"]}


def test_none_keeps_forever(any_database: Database) -> None:
    database = any_database
    add_samples(database, history())
    populate_decisions(database)
    before = table_snapshot(database)
    report = run_retention(database, KEEP_ALL, NOW + timedelta(days=10_000))
    assert report.done
    assert report.steps == 1
    assert report.rows_touched == 0
    assert table_snapshot(database) == before


def test_downsampling_without_a_deletion_age_reaches_the_oldest_samples(
    any_database: Database,
) -> None:
    database = any_database
    samples = history()
    add_samples(database, samples)
    policy = RetentionPolicy(metrics_days=None, batch_rows=7)
    report = run_retention(database, policy, NOW)
    assert report.done
    assert report.metrics_deleted == 0
    assert report.metrics_downsampled == 37 + 2
    assert_same_rows(metric_rows(database), expected_metric_rows(samples, policy, NOW))


def test_run_stops_when_asked(any_database: Database) -> None:
    database = any_database
    add_samples(database, history())
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    report = run_retention(
        database, RetentionPolicy(batch_rows=2), NOW, pause_s=0.001, should_stop=should_stop
    )
    assert report.steps == 2
    assert not report.done
    assert report.rows_touched == 4


def test_now_must_be_aware(database: Database) -> None:
    with pytest.raises(ValueError, match="naive"):
        retention_step(database, RetentionPolicy(), datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metrics_days": 0}, "metrics_days=0: must be a positive number of days"),
        ({"decisions_days": -1.0}, "decisions_days=-1.0: must be a positive"),
        ({"jobs_days": math.nan}, "jobs_days=nan: must be a positive"),
        ({"transitions_days": math.inf}, "transitions_days=inf: must be a positive"),
        ({"transitions_days": "90"}, "transitions_days='90': must be a positive"),
        ({"jobs_days": True}, "jobs_days=True: must be a positive"),
        ({"decisions_days": 1e7}, "at most 36500 days"),
        ({"metrics_full_days": 0.0}, "metrics_full_days=0.0: must be a positive"),
        ({"metrics_full_days": 30.0}, "metrics_full_days=30.0 must be less than metrics_days"),
        ({"metrics_full_days": 2, "metrics_days": 1}, "must be less than metrics_days=1"),
        ({"metrics_downsample_s": 0}, "metrics_downsample_s=0: must be a number of seconds"),
        ({"metrics_downsample_s": 0.5}, "at least 1"),
        ({"metrics_downsample_s": None}, "metrics_downsample_s=None"),
        ({"batch_rows": 0}, "batch_rows=0: must be a positive whole number"),
        ({"batch_rows": 10.0}, "batch_rows=10.0"),
    ],
)
def test_bad_policies_are_value_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        RetentionPolicy(**fields)


def test_good_policies() -> None:
    assert RetentionPolicy().metrics_days == 30.0
    assert KEEP_ALL.metrics_days is None
    # Never downsampled, deleted after a week.
    RetentionPolicy(metrics_full_days=None, metrics_days=7)
    RetentionPolicy(metrics_full_days=0.5, metrics_days=1, metrics_downsample_s=300, batch_rows=1)
