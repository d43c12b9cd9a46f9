"""Storage: migrations match the models, WAL mode, repository round-trips; on SQLite
and, where one is at hand, on PostgreSQL (``any_database``, see conftest)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from autotune.catalog.devices import node_info
from autotune.core import Decision, JobConfig, JobSpec, Placement, RankSlot, utc_now
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.tables import Base, TransitionRow
from autotune.errors import InputError
from autotune.serde import to_json


def decision(job_id: str, *, source: str = "policy", world: int = 1) -> Decision:
    placement = Placement(
        job_id=job_id,
        ranks=tuple(RankSlot(rank=r, node_id="n0", gpu_index=r) for r in range(world)),
    )
    return Decision(
        job_id=job_id,
        config=JobConfig.data_parallel(world),
        placement=placement,
        source=source,
        policy_version="rules-test",
        reason="test",
    )  # type: ignore[arg-type]


def test_migrations_create_exactly_the_models_schema(any_database: Database) -> None:
    database = any_database
    assert database.current_revision() == "0014_job_events"
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        tables = set(inspect(connection).get_table_names())
    assert tables >= {
        "nodes",
        "jobs",
        "decisions",
        "overrides",
        "transitions",
        "metrics",
        "policy_versions",
        "alembic_version",
    }


def test_sqlite_runs_in_wal_mode_with_foreign_keys(database: Database) -> None:
    with database.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    with pytest.raises(Exception, match="FOREIGN KEY"), database.session() as session:
        repo.create_decision(session=session, decision=decision("no-such-job"))


def test_jobs_decisions_round_trip_with_filters_and_pages(any_database: Database) -> None:
    database = any_database
    with database.session() as session:
        repo.upsert_nodes(
            session=session,
            nodes=[node_info("n0", gpu_model="A100", gpu_count=8, cpu_milli=1000, memory_mib=1024)],
        )
        for i in range(3):
            repo.upsert_job(session=session, spec=JobSpec(job_id=f"j{i}"), state="pending")
    start = utc_now()
    with database.session() as session:
        stored = [
            repo.create_decision(
                session=session,
                decision=decision(f"j{i % 3}", source="policy" if i < 4 else "fallback"),
            )
            for i in range(6)
        ]
    assert [d.decision_id for d in stored] == [1, 2, 3, 4, 5, 6]
    with database.session() as session:
        listed = repo.list_decisions(session=session, limit=4, offset=0)
        page, total = listed.rows, listed.count
        assert total == 6
        assert [r.decision.decision_id for r in page] == [6, 5, 4, 3]
        listed = repo.list_decisions(session=session, limit=4, offset=4)
        page, total = listed.rows, listed.count
        assert [r.decision.decision_id for r in page] == [2, 1]
        listed = repo.list_decision_rows(session=session, job_id="j1", limit=1)
        rows, total = listed.rows, listed.count
        assert total == 2
        assert rows[0]["id"] == 5
        assert rows[0]["config"] == to_json(stored[4].config)
        assert rows[0]["placement"] == to_json(stored[4].placement)
        assert rows[0]["decided_at"] == stored[4].decided_at
        total = repo.list_decisions(session=session, job_id="j1").count
        assert total == 2
        total = repo.list_decisions(session=session, source="fallback").count
        assert total == 2
        total = repo.list_decisions(session=session, since=start + timedelta(hours=1)).count
        assert total == 0
        record = repo.get_decision(session=session, decision_id=2)
        assert record is not None
        assert record.applied_at is None
        assert record.decision == stored[1]
        assert record.decision.decided_at.tzinfo is not None
        latest = repo.latest_decisions(session=session)
        assert {k: v.decision_id for k, v in latest.items()} == {"j0": 4, "j1": 5, "j2": 6}
        repo.mark_decision_applied(session=session, decision_ids=[6])
        repo.set_job_state(session=session, job_id="j2", state="running")
        assert repo.running_placements(session=session) == {"j2": stored[5].placement}
        assert repo.job_counts(session=session)["running"] == 1
        assert repo.list_nodes(session=session)[0].gpu_count == 8
    with database.session() as session:
        record = repo.get_decision(session=session, decision_id=6)
        assert record is not None
        assert record.applied_at is not None
        # A preemption (its placement stored as JSON null) is j2's newest decision while
        # j2 still reads as running: it holds no GPUs.
        stop = replace(decision("j2"), placement=None, preempt=True, reason="preempted")
        repo.create_decision(session=session, decision=stop)
        assert repo.running_placements(session=session) == {}


def test_a_failed_transaction_leaves_nothing_behind(any_database: Database) -> None:
    database = any_database

    def write_then_crash() -> None:
        with database.session() as session:
            repo.upsert_job(session=session, spec=JobSpec(job_id="ghost"), state="pending")
            raise RuntimeError("crash between write and commit")

    with pytest.raises(RuntimeError, match="crash"):
        write_then_crash()
    with database.session() as session:
        assert repo.get_job(session=session, job_id="ghost") is None


def test_policy_versions_have_one_active(any_database: Database) -> None:
    database = any_database
    with database.session() as session:
        repo.register_policy_version(session=session, version="a", kind="rules", activate=True)
        repo.register_policy_version(session=session, version="b", kind="ppo", activate=True)
        repo.register_policy_version(session=session, version="a", kind="rules")
    with database.session() as session:
        assert repo.active_policy_version(session=session) == "b"


def test_transitions_and_metrics_are_stored(any_database: Database) -> None:
    database = any_database
    with database.session() as session:
        tid = repo.create_transition(
            session=session,
            episode="run-0000",
            step=0,
            policy_version="v",
            epsilon=0.05,
            observation=repo.pack_observation(np.array([0.25, 0.5, 0.0]), 2),
            slots={
                "jobs": ["j"],
                "running": [True],
                "entries": [[0, 1, 2, 3, 0, 1, 0]],
                "mask": [[1, 0, 0, 0, 0, 0, 0]],
                "logp": [[-0.05] + [0.0] * 6],
                "applied": [True],
            },
        )
        repo.set_transition_reward(
            session=session, transition_id=tid, reward=0.5, parts={"cluster": {"goodput": 0.5}}
        )
        repo.record_metrics(session=session, values=[("gpu_utilization", 0.5, None)])
    assert tid == 1
    with database.session() as session:
        row = session.get(TransitionRow, tid)
        assert row is not None
        assert row.reward == 0.5
        assert not row.truncated
        np.testing.assert_array_equal(
            repo.unpack_observation(row.observation, 4), [0.25, 0.5, 0.0, 0.0]
        )
        assert repo.truncate_open_transitions(session=session) == 0
    with database.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM metrics")).scalar() == 1


def test_bad_database_urls_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a database URL"):
        Database("not a url")
    with pytest.raises(InputError, match="directory of the database does not exist"):
        Database(sqlite_url(tmp_path / "missing" / "x.db"))
    assert not (tmp_path / "missing").exists()


def test_db_upgrade_command_creates_the_schema(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    url = sqlite_url(tmp_path / "cli.db")
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", url])
    assert result.exit_code == 0, result.output
    assert "revision 0014_job_events" in result.stdout
    assert Database(url).current_revision() == "0014_job_events"
    bad = CliRunner().invoke(app, ["db", "upgrade", "--db", "nonsense"])
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: not a database URL")


def test_overrides_cancellation_and_tokens_round_trip(any_database: Database) -> None:
    database = any_database
    with database.session() as session:
        repo.upsert_job(
            session=session,
            spec=JobSpec(job_id="j"),
            state="running",
            task={"name": "gpt-char", "steps": 10, "origin": "api"},
        )
    now = utc_now()
    with database.session() as session:
        first = repo.create_override(
            session=session,
            job_id="j",
            pin={"precision": {"ffn": "fp32"}},
            reason="a",
            expires_at=now + timedelta(hours=1),
        )
        second = repo.create_override(
            session=session,
            job_id="j",
            pin={"compression": {"kind": "int8"}},
            reason="b",
            expires_at=now + timedelta(hours=1),
        )
    with database.session() as session:
        active = repo.active_overrides(session=session, at=utc_now())
        assert {k: v.override_id for k, v in active.items()} == {"j": second.override_id}
        replaced = repo.get_override(session=session, override_id=first.override_id)
        assert replaced is not None
        assert replaced.deleted_at is not None  # the newer one ended it
        assert repo.active_overrides(session=session, at=now + timedelta(hours=2)) == {}
        stored = repo.create_decision(
            session=session,
            decision=decision("j"),
            override_id=second.override_id,
            explanation={"why": "pinned"},
        )
        repo.request_cancel(session=session, job_id="j")
        issued = repo.add_token(session=session, token_sha256="ab" * 32, role="member", name="ci")
    with database.session() as session:
        assert stored.decision_id is not None
        record = repo.get_decision(session=session, decision_id=stored.decision_id)
        assert record is not None
        assert record.override_id == second.override_id
        assert record.explanation == {"why": "pinned"}
        assert repo.latest_decision_records(session=session)["j"].override_id == (
            second.override_id
        )
        counts, top = repo.decision_counts(session=session)
        assert counts == {"policy": 1}
        assert repo.decision_counts(session=session, after_id=top) == ({}, top)
        assert repo.cancel_requests(session=session) == ["j"]
        job = repo.get_job(session=session, job_id="j")
        assert job is not None
        assert job.task == {"name": "gpt-char", "steps": 10, "origin": "api"}
        ((digest, token),) = repo.usable_tokens(session=session)
        assert (digest, token) == ("ab" * 32, issued)
        assert (token.tenant, token.role, token.name) == ("default", "member", "ci")
        assert repo.delete_override(session=session, override_id=second.override_id) is not None
    with database.session() as session:
        assert repo.active_overrides(session=session, at=utc_now()) == {}


def test_the_daemon_decides_and_resumes_on_either_database(any_database: Database) -> None:
    from autotune.daemon.tick import Daemon, DaemonParts
    from autotune.envs.simulator import SimConfig, SimulatedCluster
    from autotune.policies.rules import RulesPolicy

    database = any_database
    daemon = Daemon(
        DaemonParts(
            db=database,
            backend=SimulatedCluster(SimConfig(seed=2)),
            policy=RulesPolicy(),
        )
    )
    daemon.start()
    for _ in range(5):
        daemon.tick()
    with database.session() as session:
        running = {r.spec.job_id for r in repo.list_jobs(session=session, state="running").rows}
        decided = repo.list_decisions(session=session).count
    assert running
    assert decided >= len(running)
    again = SimulatedCluster(SimConfig(seed=2))
    restarted = Daemon(DaemonParts(db=database, backend=again, policy=RulesPolicy()))
    restarted.start()
    restarted.tick()
    with database.session() as session:
        still = {r.spec.job_id for r in repo.list_jobs(session=session, state="running").rows}
    assert running <= still | {j.spec.job_id for j in again.observe().by_state("finished")}
