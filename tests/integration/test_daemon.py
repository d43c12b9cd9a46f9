"""The decision loop in process, and the real daemon as a user starts and stops it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import autotune_command

from autotune.core import Decision
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import ClusterSnapshot
from autotune.planner import verify_placements
from autotune.policies.rules import RulesPolicy
from autotune.rl.reward import RoundOutcome


class RecordingCluster(SimulatedCluster):
    """The simulated cluster, checking at apply() time that every decision is already
    committed (a new connection sees it) and not yet marked applied."""

    def __init__(self, db: Database, config: SimConfig) -> None:
        super().__init__(config)
        self.db = db
        self.applied: list[Decision] = []
        self.snapshots: list[ClusterSnapshot] = []

    def observe(self) -> ClusterSnapshot:
        snapshot = super().observe()
        self.snapshots.append(snapshot)
        return snapshot

    def apply(self, decisions: Sequence[Decision]) -> None:
        with self.db.session() as session:
            for decision in decisions:
                assert decision.decision_id is not None
                record = repo.get_decision(session=session, decision_id=decision.decision_id)
                assert record is not None, "applied before it was committed"
                assert record.applied_at is None
        self.applied.extend(decisions)
        super().apply(decisions)


def run_ticks(database: Database, ticks: int, seed: int = 0) -> RecordingCluster:
    backend = RecordingCluster(database, SimConfig(seed=seed))
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=RulesPolicy()))
    daemon.start()
    for _ in range(ticks):
        daemon.tick()
    return backend


def test_decisions_are_committed_before_applied_and_the_cluster_stays_valid(
    database: Database,
) -> None:
    backend = run_ticks(database, ticks=60)
    assert len(backend.applied) >= 6
    for snapshot in backend.snapshots:
        running = {
            j.spec.job_id: j.placement
            for j in snapshot.by_state("running")
            if j.placement is not None
        }
        specs = [j.spec for j in snapshot.jobs]
        assert verify_placements(specs, snapshot.nodes, running) == []
    final = backend.snapshots[-1]
    assert final.by_state("finished"), "no job finished in 60 ticks (2 simulated hours)"
    with database.session() as session:
        total = repo.list_decisions(session=session).count
        assert total == len(backend.applied)
        assert all(
            repo.get_decision(session=session, decision_id=d.decision_id).applied_at
            for d in backend.applied
            if d.decision_id
        )  # type: ignore[union-attr]
        counts = repo.job_counts(session=session)
        assert counts["finished"] == len(final.by_state("finished"))


def test_same_seed_same_decisions(tmp_path: Path) -> None:
    def decisions(name: str) -> list[tuple[str, object, str]]:
        db = Database(f"sqlite:///{tmp_path / name}")
        db.upgrade()
        applied = run_ticks(db, ticks=20, seed=3).applied
        db.dispose()
        return [(d.job_id, d.placement, d.reason) for d in applied]

    assert decisions("a.db") == decisions("b.db")


class ObserveOnlyCluster:
    """The simulated cluster behind the bare ``Backend`` interface (no ``JobControl``):
    a backend that cannot resume jobs after a restart."""

    name = "simulator"

    def __init__(self, config: SimConfig) -> None:
        self._cluster = SimulatedCluster(config)

    def observe(self) -> ClusterSnapshot:
        return self._cluster.observe()

    def run_round(self) -> RoundOutcome | None:
        return self._cluster.run_round()

    def apply(self, decisions: Sequence[Decision]) -> None:
        self._cluster.apply(decisions)

    def close(self, timeout_s: float | None = None) -> None:
        self._cluster.close()


def active_jobs(database: Database) -> dict[str, repo.JobRecord]:
    with database.session() as session:
        return {
            r.spec.job_id: r
            for s in ("pending", "running")
            for r in repo.list_jobs(session=session, state=s).rows
        }


def test_restart_resumes_the_database_jobs_where_they_were(database: Database) -> None:
    run_ticks(database, ticks=5, seed=0)
    before = active_jobs(database)
    with database.session() as session:
        all_ids = {r.spec.job_id for r in repo.list_jobs(session=session, limit=1000).rows}
        latest = repo.latest_decisions(session=session)
    assert any(r.state == "running" for r in before.values())
    backend = SimulatedCluster(SimConfig(seed=0))
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=RulesPolicy()))
    daemon.start()
    snapshot = backend.observe()
    resumed = {j.spec.job_id: j for j in snapshot.jobs}
    assert set(before) <= set(resumed)
    for job_id, record in before.items():
        assert resumed[job_id].state == record.state
        assert resumed[job_id].progress >= record.progress
        if record.state == "running":
            assert resumed[job_id].placement == latest[job_id].placement
    # New arrivals never reuse the id of a job the database holds.
    fresh = set(resumed) - set(before)
    assert not fresh & all_ids


def test_restart_fails_jobs_a_backend_cannot_resume(database: Database) -> None:
    run_ticks(database, ticks=5, seed=0)
    active = set(active_jobs(database))
    assert active
    backend = ObserveOnlyCluster(SimConfig(seed=0, initial_jobs=0, max_jobs=0))
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=RulesPolicy()))
    daemon.start()
    daemon.tick()
    with database.session() as session:
        for job_id in active:
            record = repo.get_job(session=session, job_id=job_id)
            assert record is not None
            assert record.state == "failed"
            assert "no longer knows it" in record.state_reason


# --- the real daemon ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@pytest.mark.subprocess
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_daemon_serves_decisions_within_10s_and_stops_cleanly(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    port = free_port()
    env = {**os.environ, "AUTOTUNE_DATA_DIR": str(tmp_path / "data")}
    env.pop("AUTOTUNE_DB_URL", None)
    env.pop("AUTOTUNE_CONFIG", None)
    started = time.monotonic()
    process = subprocess.Popen(
        [*autotune_command(), "daemon", "--port", str(port), "--tick-s", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body: dict[str, object] = {}
        while time.monotonic() - started < 10:
            try:
                body = get_json(f"http://127.0.0.1:{port}/api/v1/decisions")
                if body["count"]:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert body.get("count"), f"no decisions within 10 s: {body}"
        assert get_json(f"http://127.0.0.1:{port}/api/v1/healthz")["status"] == "ok"
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert "decision" in events
    assert events[-1] == "daemon.stop"
    decision = next(line for line in lines if line["event"] == "decision")
    assert {"job", "placement", "reason", "decision_id"} <= set(decision)
    assert (tmp_path / "data" / "autotune.db").exists()


@pytest.mark.subprocess
def test_bad_settings_exit_2_before_touching_the_database(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [*autotune_command(), "daemon", "--tick-s", "-1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("error: setting tick_s=-1.0")
    assert not (tmp_path / "data").exists()


class CrashingCluster(SimulatedCluster):
    """Dies in ``apply`` at its ``crash_at``-th tick: after the decisions were
    committed, before they took effect (what a SIGKILL there would leave)."""

    def __init__(self, config: SimConfig, crash_at: int) -> None:
        super().__init__(config)
        self.crash_at = crash_at
        self.ticks = 0

    def apply(self, decisions: Sequence[Decision]) -> None:
        self.ticks += 1
        if self.ticks == self.crash_at and decisions:
            raise SystemExit("killed between commit and apply")
        super().apply(decisions)


def run_until_killed(daemon: Daemon) -> None:
    for _ in range(20):
        daemon.tick()


def test_a_crash_between_commit_and_apply_leaves_decisions_marked_unapplied(
    database: Database,
) -> None:
    config = SimConfig(seed=0, mean_interarrival_s=60)
    daemon = Daemon(
        DaemonParts(db=database, backend=CrashingCluster(config, crash_at=2), policy=RulesPolicy())
    )
    daemon.start()
    with pytest.raises(SystemExit):
        run_until_killed(daemon)
    with database.session() as session:
        records = repo.list_decisions(session=session, limit=1000).rows
        unapplied = [r.decision for r in records if r.applied_at is None]
        states = {r.spec.job_id: r.state for r in repo.list_jobs(session=session, limit=1000).rows}
    assert unapplied, "the crash tick committed decisions"
    # What was decided but never applied is visible as such, and the job rows still say
    # what was true: a job whose start was not applied is still pending.
    for decision in unapplied:
        assert states[decision.job_id] == "pending"
    restarted = Daemon(
        DaemonParts(db=database, backend=SimulatedCluster(config), policy=RulesPolicy())
    )
    restarted.start()
    report = restarted.tick()
    with database.session() as session:
        for decision in unapplied:
            assert decision.decision_id is not None
            record = repo.get_decision(session=session, decision_id=decision.decision_id)
            assert record is not None
            assert record.applied_at is None  # it never took effect, and says so
            job = repo.get_job(session=session, job_id=decision.job_id)
            assert job is not None
            placed_again = any(d.job_id == decision.job_id for d in report.decisions)
            assert job.state == ("running" if placed_again else "pending")


@pytest.mark.subprocess
def test_an_unknown_backend_exits_2_naming_the_ones_there_are(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [*autotune_command(), "daemon", "--backend", "warp-drive"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "error: setting backend='warp-drive': unknown; available: sim, ray\n"
    assert not (tmp_path / "data").exists()
