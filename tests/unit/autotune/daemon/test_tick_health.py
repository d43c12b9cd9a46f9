"""A failing tick is counted, shown by /readyz and /metrics, and after FALLBACK_AFTER of
them in a row the fallback policy decides; and the job rows record when each job started
and finished. On a small in-test cluster behind the ``Backend`` protocol, so the tests do
not depend on the simulated cluster's model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from autotune.api.app import attach_daemon, create_app
from autotune.catalog.devices import node_info
from autotune.core import Decision, JobConfig, JobSpec
from autotune.daemon.tick import FALLBACK_AFTER, Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.interfaces import (
    Backend,
    ClusterSnapshot,
    JobMetrics,
    JobStatus,
    Policy,
    PolicyChoice,
    PolicyRound,
)

NODES = (node_info("n0", gpu_model="A100", gpu_count=8, cpu_milli=64_000, memory_mib=65_536),)


class TinyCluster:
    """Opaque jobs (no model profile) of one GPU each, submitted at ``submit_s``; a job
    runs for ``run_s`` seconds of the cluster's clock, which moves by ``tick_s`` at each
    ``observe()``. ``broken`` makes ``observe()`` raise (a backend failure)."""

    name = "tiny"

    def __init__(
        self, jobs: int = 3, *, tick_s: float = 60.0, run_s: float = 120.0, submit_s: float = 30.0
    ) -> None:
        self.time_s = submit_s
        self.tick_s = tick_s
        self.run_s = run_s
        self.broken = False
        self.jobs = {
            f"j{i}": JobStatus(spec=JobSpec(job_id=f"j{i}", submitted_at=submit_s), state="pending")
            for i in range(jobs)
        }

    def observe(self) -> ClusterSnapshot:
        if self.broken:
            raise ConnectionError("cluster unreachable")
        self.time_s += self.tick_s
        for job_id, job in self.jobs.items():
            started = job.started_s
            if job.state == "running" and started is not None:
                if self.time_s - started >= self.run_s:
                    self.jobs[job_id] = replace(
                        job,
                        state="finished",
                        placement=None,
                        progress=1.0,
                        finished_s=started + self.run_s,
                    )
                else:
                    self.jobs[job_id] = replace(job, progress=(self.time_s - started) / self.run_s)
        busy = sum(len(j.placement.ranks) for j in self.jobs.values() if j.placement is not None)
        return ClusterSnapshot(
            time_s=self.time_s,
            nodes=NODES,
            jobs=list(self.jobs.values()),
            telemetry="tiny",
            gpu_utilization=busy / 8,
        )

    def apply(self, decisions: Sequence[Decision]) -> None:
        for decision in decisions:
            if decision.placement is None:
                continue
            job = self.jobs[decision.job_id]
            self.jobs[decision.job_id] = replace(
                job,
                state="running",
                config=decision.config,
                placement=decision.placement,
                started_s=self.time_s if job.started_s is None else job.started_s,
            )

    def close(self, timeout_s: float | None = None) -> None:
        pass


class OneGpu:
    """Every pending job on one GPU."""

    name = "one-gpu"
    version = "one-gpu-1"

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        return PolicyRound(
            choices={
                j.spec.job_id: PolicyChoice(config=JobConfig.data_parallel(1), reason="one GPU")
                for j in snapshot.by_state("pending")
            }
        )


class Flaky:
    """Raises ``KeyError('weights')`` on its first ``failures`` calls, then decides as
    ``OneGpu`` (``failures=None``: raises on every call)."""

    name = "flaky"
    version = "flaky-1"

    def __init__(self, failures: int | None) -> None:
        self.failures = failures
        self.calls = 0

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise KeyError("weights")
        return OneGpu().decide(snapshot)


def test_the_fakes_satisfy_the_interfaces() -> None:
    assert isinstance(TinyCluster(), Backend)
    assert isinstance(OneGpu(), Policy)
    assert isinstance(Flaky(None), Policy)


class Service:
    def __init__(self, database: Database, policy: Policy, backend: TinyCluster) -> None:
        self.daemon = Daemon(
            DaemonParts(db=database, backend=backend, policy=policy, fallback=OneGpu())
        )
        self.daemon.start()
        self.app = create_app(db=database, telemetry="tiny")
        attach_daemon(self.app, self.daemon)
        self.client = TestClient(self.app)

    def tick(self) -> list[Decision]:
        return self.daemon.tick().decisions

    def failing_tick(self, error: type[Exception]) -> None:
        with pytest.raises(error):
            self.daemon.tick()


ServiceOf = Callable[..., Service]
"""``service_of(policy, backend=TinyCluster())``"""


@pytest.fixture
def service_of(database: Database) -> Iterator[ServiceOf]:
    made: list[Service] = []

    def make(policy: Policy, backend: TinyCluster | None = None) -> Service:
        made.append(Service(database, policy, backend or TinyCluster()))
        return made[-1]

    yield make
    for service in made:
        service.client.close()


def _metric(body: str, name: str) -> float:
    lines = [line for line in body.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, (name, body)
    return float(lines[0].split()[-1])


def test_a_policy_failing_every_tick_hands_over_to_the_fallback(
    service_of: ServiceOf,
) -> None:
    service = service_of(Flaky(None))
    assert service.client.get("/readyz").status_code == 200
    for done in range(1, FALLBACK_AFTER + 1):
        service.failing_tick(KeyError)
        ready = service.client.get("/api/v1/readyz")
        assert ready.status_code == 503
        tick = ready.json()["tick"]
        assert tick["consecutive_failures"] == done
        assert tick["last_error"] == "KeyError: 'weights'"
        assert tick["fallback"] is (done >= FALLBACK_AFTER)
    decisions = service.tick()  # the 4th: the policy fails again, the fallback decides
    assert decisions
    for decision in decisions:
        assert decision.source == "fallback"
        assert decision.policy_version == "one-gpu-1"
        assert decision.reason.startswith(
            f"{FALLBACK_AFTER} consecutive failed ticks (KeyError: 'weights'); "
            "deciding with one-gpu: one GPU"
        )
    with service.daemon.db.session() as session:
        stored = repo.list_decisions(session=session, source="fallback").rows
        assert {r.decision.job_id for r in stored} == {d.job_id for d in decisions}
        assert {v.version for v in repo.list_policy_versions(session=session)} == {
            "flaky-1",
            "one-gpu-1",
        }
        assert repo.active_policy_version(session=session) == "flaky-1"
    ready = service.client.get("/readyz")
    assert ready.status_code == 503
    body = ready.json()
    assert body["database"] is True
    assert body["policy_version"] == "flaky-1"
    assert body["tick"] == {
        "ok": False,
        "consecutive_failures": FALLBACK_AFTER,
        "failures_total": FALLBACK_AFTER,
        "last_error": "KeyError: 'weights'",
        "last_failure_at": body["tick"]["last_failure_at"],
        "fallback": True,
        "fallback_policy": "one-gpu",
        "paused": None,
        "paused_since": None,
    }
    assert body["reasons"] == [
        f"{FALLBACK_AFTER} consecutive failed tick(s); last error: KeyError: 'weights'; "
        "deciding with the fallback policy one-gpu"
    ]
    metrics = service.client.get("/metrics").text
    assert _metric(metrics, "autotune_tick_failures_total") >= FALLBACK_AFTER
    assert _metric(metrics, "autotune_tick_fallback") == 1.0
    assert _metric(metrics, "autotune_tick_consecutive_failures") == FALLBACK_AFTER
    assert 'autotune_decisions_total{source="fallback"}' in metrics
    service.tick()  # the fallback goes on deciding while the policy fails
    assert service.daemon.health.fallback == "one-gpu"
    assert service.client.get("/readyz").status_code == 503


def test_a_policy_that_recovers_ends_the_fallback(service_of: ServiceOf) -> None:
    service = service_of(Flaky(FALLBACK_AFTER + 1))  # fails 3 ticks, then the probe
    for _ in range(FALLBACK_AFTER):
        service.failing_tick(KeyError)
    assert {d.source for d in service.tick()} == {"fallback"}
    assert service.daemon.health.fallback == "one-gpu"
    service.daemon.backend.jobs["late"] = JobStatus(  # type: ignore[attr-defined]
        spec=JobSpec(job_id="late"), state="pending"
    )
    decisions = service.tick()  # the policy answers again
    assert [(d.job_id, d.source) for d in decisions] == [("late", "policy")]
    health = service.daemon.health
    assert health.ok
    assert health.failures_total == FALLBACK_AFTER
    assert service.client.get("/readyz").status_code == 200
    assert _metric(service.client.get("/metrics").text, "autotune_tick_fallback") == 0.0


def test_two_failures_then_success_never_fall_back(service_of: ServiceOf) -> None:
    service = service_of(Flaky(2))
    for _ in range(2):
        service.failing_tick(KeyError)
    assert service.client.get("/readyz").status_code == 503
    decisions = service.tick()
    assert decisions
    assert {d.source for d in decisions} == {"policy"}
    ready = service.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["reasons"] == []
    assert ready.json()["tick"]["ok"] is True
    assert ready.json()["tick"]["failures_total"] == 2
    metrics = service.client.get("/metrics").text
    assert _metric(metrics, "autotune_tick_failures_total") == 2.0
    assert _metric(metrics, "autotune_tick_consecutive_failures") == 0.0
    assert _metric(metrics, "autotune_tick_fallback") == 0.0


def test_failures_outside_the_policy_keep_failing_and_are_counted(
    service_of: ServiceOf,
) -> None:
    backend = TinyCluster()
    service = service_of(OneGpu(), backend)
    backend.broken = True
    for _ in range(FALLBACK_AFTER + 2):
        service.failing_tick(ConnectionError)
    health = service.daemon.health
    assert health.consecutive_failures == FALLBACK_AFTER + 2
    assert health.fallback == "one-gpu"
    assert health.last_error == "ConnectionError: cluster unreachable"
    body = service.client.get("/readyz").json()
    assert "ConnectionError: cluster unreachable" in body["reasons"][0]
    backend.broken = False
    decisions = service.tick()  # its own policy decides: the fallback ends
    assert decisions
    assert {d.source for d in decisions} == {"policy"}
    assert service.daemon.health.ok
    assert service.client.get("/readyz").status_code == 200


def test_without_a_fallback_failures_are_counted_and_the_policy_kept(
    database: Database,
) -> None:
    daemon = Daemon(DaemonParts(db=database, backend=TinyCluster(), policy=Flaky(None)))
    daemon.start()
    for _ in range(FALLBACK_AFTER + 1):
        with pytest.raises(KeyError):
            daemon.tick()
    assert daemon.health.consecutive_failures == FALLBACK_AFTER + 1
    assert daemon.health.fallback is None
    assert not daemon.health.ok


def test_run_logs_failed_ticks_and_goes_on(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    daemon = Daemon(
        DaemonParts(db=database, backend=TinyCluster(), policy=Flaky(None), fallback=OneGpu())
    )
    daemon.start()
    stop = threading.Event()
    seen: list[int] = []

    def observe(report: object) -> None:
        seen.append(1)
        stop.set()  # the first tick that succeeds (the fallback's) ends the run

    daemon.add_tick_observer(observe)
    with caplog.at_level("INFO", logger="autotune"):
        daemon.run(stop, tick_s=0.0)
    failed = [r for r in caplog.records if r.getMessage() == "tick.failed"]
    assert len(failed) == FALLBACK_AFTER
    assert [r.failures for r in failed] == [1, 2, 3]  # type: ignore[attr-defined]
    assert all(r.exc_info for r in failed)
    assert [r.getMessage() for r in caplog.records].count("tick.fallback") == 1
    assert seen == [1]


# --- job times --------------------------------------------------------------------------


def _jobs(client: TestClient) -> dict[str, dict[str, object]]:
    return {j["job_id"]: j for j in client.get("/api/v1/jobs").json()["data"]}


def test_jobs_show_when_they_started_and_finished(service_of: ServiceOf) -> None:
    backend = TinyCluster(jobs=2, tick_s=60.0, run_s=120.0, submit_s=30.0)
    service = service_of(OneGpu(), backend)
    service.tick()  # clock 90: seen pending, decided, applied
    jobs = _jobs(service.client)
    for job in jobs.values():
        assert job["state"] == "running"
        assert job["started_at"] is not None
        assert job["finished_at"] is None
        assert job["jct_s"] is None
        assert job["sim_submitted_s"] == 30.0
        assert job["sim_started_s"] is None  # the backend says so at its next observe()
    service.tick()  # clock 150: running, started at 90 on the backend's clock
    shown = service.client.get("/api/v1/jobs/j0").json()
    assert shown["sim_started_s"] == 90.0
    assert shown["sim_finished_s"] is None
    assert shown["started_at"] == jobs["j0"]["started_at"]  # the first time it ran
    service.tick()  # clock 210: finished at 90 + 120
    shown = service.client.get("/api/v1/jobs/j0").json()
    assert shown["state"] == "finished"
    assert shown["sim_finished_s"] == 210.0
    assert shown["jct_s"] == 180.0  # 210 - 30, on the backend's clock
    assert shown["finished_at"] >= shown["started_at"] >= shown["submitted_at"]
    assert _jobs(service.client)["j1"]["jct_s"] == 180.0  # the list shares the schema
    service.tick()  # nothing changes: nothing is rewritten
    assert service.client.get("/api/v1/jobs/j0").json() == shown


class Measured(TinyCluster):
    """A ``TinyCluster`` whose jobs report their throughput, and whose ``apply`` reads
    the database as an API reader would at that moment: what it saw of each finished
    job's figures is in ``seen``."""

    def __init__(self, database: Database) -> None:
        super().__init__(jobs=2, tick_s=60.0, run_s=60.0, submit_s=30.0)
        self.database = database
        self.seen: dict[str, dict[str, float]] = {}

    def observe(self) -> ClusterSnapshot:
        snapshot = super().observe()
        for job_id, job in self.jobs.items():
            if job.state in ("running", "finished"):
                self.jobs[job_id] = replace(job, metrics=JobMetrics(samples_per_s=7.0))
        return replace(snapshot, jobs=list(self.jobs.values()))

    def apply(self, decisions: Sequence[Decision]) -> None:
        with self.database.session() as session:
            for record in repo.list_jobs(session=session, state="finished").rows:
                job_id = record.spec.job_id
                self.seen[job_id] = repo.job_metrics(session=session, job_id=job_id)
        super().apply(decisions)


def test_a_finished_jobs_last_figures_commit_with_its_state(
    service_of: ServiceOf, database: Database
) -> None:
    backend = Measured(database)
    service = service_of(OneGpu(), backend)
    service.tick()  # clock 90: both placed
    service.tick()  # clock 150: both finished; apply() runs after the state commits
    assert backend.seen == {
        "j0": {"samples_per_s": 7.0},
        "j1": {"samples_per_s": 7.0},
    }


def test_jct_falls_back_to_the_daemons_clock(database: Database) -> None:
    spec = JobSpec(job_id="x")
    with database.session() as session:
        repo.upsert_job(session=session, spec=spec, state="pending")
    with database.session() as session:
        repo.set_job_state(session=session, job_id="x", state="running")
    with database.session() as session:
        record = repo.get_job(session=session, job_id="x")
        assert record is not None
        assert record.started_at is not None
        assert record.finished_at is None
        assert record.jct_s is None
        started = record.started_at
        repo.set_job_state(session=session, job_id="x", state="pending")  # resumed
        repo.set_job_state(session=session, job_id="x", state="running")
    with database.session() as session:
        repo.upsert_job(session=session, spec=spec, state="cancelled", reason="cancelled")
    with database.session() as session:
        record = repo.get_job(session=session, job_id="x")
        assert record is not None
        assert record.started_at == started  # the first time it ran
        assert record.finished_at is not None
        assert record.sim_finished_s is None
        assert record.jct_s == pytest.approx(
            (record.finished_at - record.submitted_at).total_seconds()
        )
        assert record.finished_at - record.submitted_at < timedelta(minutes=1)


def test_backend_times_are_kept_once_known(database: Database) -> None:
    spec = JobSpec(job_id="y", submitted_at=5.0)
    with database.session() as session:
        repo.upsert_job(
            session=session, spec=spec, state="running", sim_submitted_s=5.0, sim_started_s=7.0
        )
    with database.session() as session:  # a backend that no longer knows them says None
        repo.upsert_job(
            session=session, spec=spec, state="finished", progress=1.0, sim_finished_s=20.0
        )
    with database.session() as session:
        record = repo.get_job(session=session, job_id="y")
        assert record is not None
        assert (record.sim_submitted_s, record.sim_started_s, record.sim_finished_s) == (
            5.0,
            7.0,
            20.0,
        )
        assert record.started_at is not None
        assert record.finished_at is not None
        assert record.jct_s == 15.0
