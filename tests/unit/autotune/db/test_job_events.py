"""Job events: what a backend reports of its jobs while they train is taken by the
daemon's tick, stored once, listed per job (oldest first, by kind, page by page) through
the repository and the API (the command line's: ``test_cli_tenants``), and deleted by
retention with the decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autotune.api.app import create_app
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.retention import RetentionPolicy, run_retention
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import JobEvents
from autotune.policies.rules import RulesPolicy

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _event(kind: str, at: datetime, **detail: Any) -> dict[str, Any]:
    return {"kind": kind, "at": at.timestamp(), **detail}


def test_events_are_listed_per_job_oldest_first_by_kind_and_page(any_database: Database) -> None:
    with any_database.session() as session:
        stored = repo.record_job_events(
            session=session,
            events=[
                ("j1", _event("node_lost", T0, nodes=["n1"], step=40)),
                ("j2", _event("resumed", T0, step=30)),
                ("j1", _event("resumed", T0 + timedelta(seconds=5), step=31, steps_redone=9)),
                ("j1", _event("grad_norm_growth", T0 + timedelta(seconds=9), step=50)),
            ],
        )
    assert stored == 4
    with any_database.session() as session:
        page = repo.list_job_events(session=session, job_id="j1")
        assert [e.kind for e in page.rows] == ["node_lost", "resumed", "grad_norm_growth"]
        assert page.rows[0].detail == {"nodes": ["n1"], "step": 40}
        assert page.rows[1].at == T0 + timedelta(seconds=5)
        assert page.count == 3
        resumed = repo.list_job_events(session=session, job_id="j1", kind="resumed").rows
        assert [e.detail["steps_redone"] for e in resumed] == [9]
        first = repo.list_job_events(session=session, job_id="j1", limit=2)
        assert first.next_cursor is not None
        rest = repo.list_job_events(session=session, job_id="j1", limit=2, cursor=first.next_cursor)
        assert [e.kind for e in rest.rows] == ["grad_norm_growth"]
        assert rest.next_cursor is None


def test_an_events_fields_are_stored_as_plain_json(any_database: Database) -> None:
    """A balancer's seconds per sample may be infinite, shares a tuple, a figure a numpy
    scalar: every database takes them (PostgreSQL's JSON refuses NaN and Infinity)."""
    import numpy as np

    odd = _event(
        "batch_shares",
        T0,
        seconds_per_sample=[float("inf"), float("nan"), 0.5],
        to=(2, 1),
        gain=np.float64(0.25),
        step=np.int64(12),
    )
    with any_database.session() as session:
        repo.record_job_events(session=session, events=[("j", odd)])
    with any_database.session() as session:
        (stored,) = repo.list_job_events(session=session, job_id="j").rows
    assert stored.detail == {
        "seconds_per_sample": ["inf", "nan", 0.5],
        "to": [2, 1],
        "gain": 0.25,
        "step": 12,
    }
    # A malformed event is stored as well as can be, never failing the tick's write.
    before = datetime.now(UTC)
    with any_database.session() as session:
        repo.record_job_events(session=session, events=[("k", {"at": float("nan"), "x": 1})])
    with any_database.session() as session:
        (bare,) = repo.list_job_events(session=session, job_id="k").rows
    assert (bare.kind, bare.detail) == ("unknown", {"x": 1})
    assert bare.at >= before - timedelta(seconds=1)


def test_retention_deletes_events_older_than_the_decisions_kept(any_database: Database) -> None:
    now = T0 + timedelta(days=100)
    with any_database.session() as session:
        repo.record_job_events(
            session=session,
            events=[
                ("old", _event("resumed", now - timedelta(days=91), step=1)),
                ("new", _event("resumed", now - timedelta(days=89), step=2)),
            ],
        )
    report = run_retention(any_database, RetentionPolicy(decisions_days=90.0), now)
    assert report.deleted["job_events"] == 1
    with any_database.session() as session:
        assert repo.list_job_events(session=session, job_id="old").rows == []
        assert len(repo.list_job_events(session=session, job_id="new").rows) == 1
    kept = run_retention(any_database, RetentionPolicy(decisions_days=None), now + timedelta(1e3))
    assert kept.deleted["job_events"] == 0


class _Reporting(SimulatedCluster):
    """The simulated cluster, reporting a ``resumed`` event for every job running after
    a round, as a backend that trains for real reports what happens to its jobs."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.reported: list[tuple[str, dict[str, Any]]] = []
        self._untaken: list[tuple[str, dict[str, Any]]] = []

    def observe(self):  # type: ignore[no-untyped-def]
        snapshot = super().observe()
        for job in snapshot.by_state("running"):
            pair = (job.spec.job_id, _event("resumed", T0, step=len(self.reported)))
            self.reported.append(pair)
            self._untaken.append(pair)
        return snapshot

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        taken, self._untaken = self._untaken, []
        return taken


def test_the_tick_stores_each_reported_event_once_and_the_api_lists_them(
    database: Database,
) -> None:
    backend = _Reporting(SimConfig(seed=1))
    assert isinstance(backend, JobEvents)
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=RulesPolicy()))
    daemon.start()
    for _ in range(4):
        daemon.tick()
    with database.session() as session:
        stored = [
            (job_id, e.detail["step"])
            for job_id in {j for j, _ in backend.reported}
            for e in repo.list_job_events(session=session, job_id=job_id).rows
        ]
    # every event taken in a tick is stored by it (the last observe's included), once
    assert sorted(stored) == sorted((j, e["step"]) for j, e in backend.reported)
    job_id = backend.reported[0][0]
    with TestClient(create_app(db=database, telemetry="simulator")) as client:
        listed = client.get(f"/api/v1/jobs/{job_id}/events").json()
        assert listed["count"] == len([1 for j, _ in backend.reported if j == job_id])
        assert {e["kind"] for e in listed["data"]} == {"resumed"}
        assert client.get("/api/v1/jobs/nope/events").status_code == 404
        assert client.get(f"/api/v1/jobs/{job_id}/events?limit=0").status_code == 422


def test_events_taken_in_a_tick_whose_write_fails_are_stored_by_the_next(
    database: Database, monkeypatch: Any
) -> None:
    backend = _Reporting(SimConfig(seed=1))
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=RulesPolicy()))
    daemon.start()
    daemon.tick()
    daemon.tick()
    record = repo.record_job_events

    def unwritable(**_: Any) -> int:
        raise RuntimeError("the database is away")

    monkeypatch.setattr(repo, "record_job_events", unwritable)
    with pytest.raises(RuntimeError, match="the database is away"):
        daemon.tick()
    monkeypatch.setattr(repo, "record_job_events", record)
    daemon.tick()
    with database.session() as session:
        stored = sorted(
            (job_id, e.detail["step"])
            for job_id in {j for j, _ in backend.reported}
            for e in repo.list_job_events(session=session, job_id=job_id).rows
        )
    assert stored == sorted((j, e["step"]) for j, e in backend.reported)
