"""A database with a history: the repository's ``at`` (writes stamped with a time of the
caller's instead of now), and ``bench/history.py``, which builds the database the daemon
would leave after days of deciding, through the repository, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select

from autotune.catalog.devices import node_info
from autotune.core import JobSpec, utc_now
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.tables import (
    DecisionRow,
    JobRow,
    MetricRow,
    NodeRow,
    OverrideRow,
    PolicyVersionRow,
    TransitionRow,
)

THEN = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _history() -> ModuleType:
    """The history builder (``autotune.benchmarks.history``, ``bench/history.py``)."""
    from autotune.benchmarks import history

    return history


# --- the repository's ``at`` ----------------------------------------------------------


def test_writes_take_the_time_they_are_given(any_database: Database) -> None:
    node = node_info("n0", gpu_model="A100", gpu_count=8, cpu_milli=1000, memory_mib=1024)
    spec = JobSpec(job_id="j1")
    with any_database.session() as session:
        repo.upsert_nodes(session=session, nodes=[node], at=THEN)
        repo.register_policy_version(session=session, version="v1", kind="rules", at=THEN)
        repo.upsert_job(session=session, spec=spec, state="pending", at=THEN)
        repo.upsert_job(session=session, spec=spec, state="running", at=THEN + timedelta(minutes=1))
        repo.set_job_state(
            session=session, job_id="j1", state="finished", at=THEN + timedelta(minutes=5)
        )
        first = repo.create_override(
            session=session,
            job_id="j1",
            pin={"compression": {"kind": "none"}},
            reason="first",
            expires_at=THEN + timedelta(hours=1),
            at=THEN + timedelta(minutes=2),
        )
        # A newer override ends the active one at its own time, not now.
        second = repo.create_override(
            session=session,
            job_id="j1",
            pin={"compression": {"kind": "int8"}},
            reason="second",
            expires_at=THEN + timedelta(hours=1),
            at=THEN + timedelta(minutes=3),
        )
        deleted = repo.delete_override(
            session=session, override_id=second.override_id, at=THEN + timedelta(minutes=4)
        )
        transition = repo.create_transition(
            session=session,
            episode="run-0000",
            step=0,
            policy_version="v1",
            epsilon=0.0,
            observation=repo.pack_observation(np.zeros(1), 1),
            slots={"jobs": [], "running": [], "entries": [], "mask": [], "logp": [], "applied": []},
            at=THEN,
        )
    with any_database.session() as session:
        job = repo.get_job(session=session, job_id="j1")
        assert job is not None
        assert job.submitted_at == THEN
        assert job.started_at == THEN + timedelta(minutes=1)
        assert job.finished_at == job.updated_at == THEN + timedelta(minutes=5)
        assert session.get(NodeRow, "n0").updated_at == THEN  # type: ignore[union-attr]
        assert session.get(PolicyVersionRow, "v1").created_at == THEN  # type: ignore[union-attr]
        assert session.get(TransitionRow, transition).created_at == THEN  # type: ignore[union-attr]
        ended = repo.get_override(session=session, override_id=first.override_id)
        assert ended is not None
        assert ended.deleted_at == THEN + timedelta(minutes=3)
        assert second.created_at == THEN + timedelta(minutes=3)
        assert deleted is not None
        assert deleted.deleted_at == THEN + timedelta(minutes=4)


def test_without_at_writes_are_stamped_now(any_database: Database) -> None:
    before = utc_now()
    with any_database.session() as session:
        repo.upsert_job(session=session, spec=JobSpec(job_id="j1"), state="running")
        repo.set_job_state(session=session, job_id="j1", state="failed")
        override = repo.create_override(
            session=session,
            job_id="j1",
            pin={},
            reason="r",
            expires_at=before + timedelta(hours=1),
        )
    after = utc_now()
    with any_database.session() as session:
        job = repo.get_job(session=session, job_id="j1")
    assert job is not None
    assert job.started_at is not None
    assert job.finished_at is not None
    assert before <= job.submitted_at <= job.started_at <= job.finished_at <= after
    assert before <= override.created_at <= after


# --- bench/history.py -----------------------------------------------------------------

END = datetime(2025, 3, 1, tzinfo=UTC)
DAYS = 0.05
DECISIONS_PER_DAY = 35_000


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, dict[str, Any]]]:
    """A tiny history (72 minutes of a 32-GPU cluster), built once for the module."""
    path = tmp_path_factory.mktemp("history") / "history.db"
    summary = _history().build_history(
        f"sqlite:///{path}",
        days=DAYS,
        cluster_gpus=32,
        tick_s=2.0,
        decisions_per_day=DECISIONS_PER_DAY,
        seed=3,
        end=END,
        progress=False,
    )
    db = Database(f"sqlite:///{path}")
    yield db, summary
    db.dispose()


def test_every_job_ends_final_with_consistent_times(
    history: tuple[Database, dict[str, Any]],
) -> None:
    db, summary = history
    with db.session() as session:
        counts = repo.job_counts(session=session)
        rows = list(session.scalars(select(JobRow)))
    assert counts["pending"] == counts["running"] == 0
    assert counts["finished"] > counts["failed"] + counts["cancelled"] > 0
    assert len(rows) == summary["rows"]["jobs"] > 20
    for row in rows:
        assert row.finished_at is not None
        assert row.sim_finished_s is not None
        assert row.sim_submitted_s is not None
        assert row.task is not None
        assert row.submitted_at <= row.finished_at
        assert (row.started_at is None) == (row.sim_started_s is None)
        if row.started_at is not None:
            assert row.sim_started_s is not None
            assert row.submitted_at <= row.started_at <= row.finished_at
            assert row.sim_submitted_s <= row.sim_started_s <= row.sim_finished_s
        assert row.updated_at == row.finished_at
        assert 0.0 <= row.progress <= 1.0
        assert (row.progress == 1.0) == (row.state == "finished")


def test_decisions_are_explained_and_as_many_as_asked(
    history: tuple[Database, dict[str, Any]],
) -> None:
    db, summary = history
    with db.session() as session:
        decisions = list(session.scalars(select(DecisionRow)))
        job_ids = set(session.scalars(select(JobRow.job_id)))
    expected = DECISIONS_PER_DAY * DAYS
    assert 0.85 * expected <= len(decisions) <= 1.15 * expected
    assert summary["rows"]["decisions"] == len(decisions)
    sources = summary["decisions_by_source"]
    assert set(sources) == {"policy", "override", "fallback"}  # this seed has each kind
    assert summary["rows"]["overrides"] == sources["override"]
    assert sources["policy"] > 0.8 * len(decisions)
    for row in decisions:
        assert row.job_id in job_ids
        assert row.applied_at == row.decided_at
        assert row.placement is not None
        assert row.placement["job_id"] == row.job_id
        explanation = row.explanation
        assert explanation is not None
        assert set(explanation) == {
            "features",
            "chosen",
            "alternatives",
            "why",
            "performance_model",
            "statistical_efficiency",
        }
        assert explanation["why"].startswith(row.reason.rsplit("; placed on ", 1)[0])
        assert row.policy_version in ("ppo-0.1.0", "rules-0.1.0")
        if row.source == "override":
            assert row.override_id is not None
            assert row.reason.startswith(f"override {row.override_id}: ")
        if row.source == "fallback":
            assert "consecutive failed ticks" in row.reason


def test_metrics_are_the_daemons_at_the_sampled_ticks(
    history: tuple[Database, dict[str, Any]],
) -> None:
    db, summary = history
    history_module = _history()
    ticks = summary["ticks"]
    cluster_samples = -(-ticks // history_module.DEFAULT_CLUSTER_METRICS_EVERY)
    with db.session() as session:
        by_name = dict(
            session.execute(select(MetricRow.name, func.count()).group_by(MetricRow.name)).all()
        )
    for name in ("tick_duration_s", "jobs_running", "jobs_pending", "gpu_utilization"):
        assert by_name[name] == cluster_samples
    assert by_name["job_goodput"] > 0
    assert by_name["job_goodput"] == by_name["job_power_watts"] == by_name["job_step_time_s"]
    assert summary["rows"]["metrics"] == sum(by_name.values())


def test_every_time_lies_in_the_history(history: tuple[Database, dict[str, Any]]) -> None:
    db, summary = history
    start = END - timedelta(days=DAYS)
    assert summary["start"] == start.isoformat()
    assert summary["end"] == END.isoformat()
    columns = [
        DecisionRow.decided_at,
        DecisionRow.applied_at,
        MetricRow.recorded_at,
        JobRow.submitted_at,
        JobRow.updated_at,
        JobRow.started_at,
        JobRow.finished_at,
        OverrideRow.created_at,
        OverrideRow.deleted_at,
        TransitionRow.created_at,
        NodeRow.updated_at,
        PolicyVersionRow.created_at,
    ]
    with db.session() as session:
        for column in columns:
            low, high = session.execute(select(func.min(column), func.max(column))).one()
            if low is None:
                continue  # no override deleted, say, in so short a history
            assert high is not None
            assert start <= low <= high < END, column


def test_the_decision_listing_pages_through_the_history(
    history: tuple[Database, dict[str, Any]],
) -> None:
    db, summary = history
    seen: list[int] = []
    cursor = None
    with db.session() as session:
        while True:
            page = repo.list_decision_rows(session=session, limit=200, cursor=cursor)
            seen += [row["id"] for row in page.rows]
            cursor = page.next_cursor
            if cursor is None:
                break
    assert len(seen) == len(set(seen)) == summary["rows"]["decisions"]
    assert seen == sorted(seen, reverse=True)


def test_the_command_writes_its_summary(tmp_path: Path) -> None:
    out, summary_path = tmp_path / "h.db", tmp_path / "h.json"
    _history().main(
        [
            "--out",
            str(out),
            "--days",
            "0.01",
            "--cluster-gpus",
            "16",
            "--end",
            "2025-03-01T00:00:00",
            "--json-out",
            str(summary_path),
            "--no-progress",
        ]
    )
    summary = json.loads(summary_path.read_text())
    assert summary["end"] == "2025-03-01T00:00:00+00:00"
    assert summary["rows"]["nodes"] == 2
    assert summary["rows"]["decisions"] > 0
    assert summary["file_bytes"] == out.stat().st_size > 0
    with pytest.raises(SystemExit):  # an existing file is not overwritten unasked
        _history().main(["--out", str(out), "--days", "0.01", "--no-progress"])


def test_a_history_builds_on_postgresql_too(postgres_database: Database) -> None:
    summary = _history().build_history(
        postgres_database.url,
        days=0.01,
        cluster_gpus=16,
        tick_s=2.0,
        decisions_per_day=20_000,
        seed=1,
        end=END,
        progress=False,
    )
    assert summary["file_bytes"] is None
    assert summary["jobs_by_state"]["pending"] == summary["jobs_by_state"]["running"] == 0
    with postgres_database.session() as session:
        count = session.scalar(select(func.count()).select_from(DecisionRow))
    assert count == summary["rows"]["decisions"] > 0
