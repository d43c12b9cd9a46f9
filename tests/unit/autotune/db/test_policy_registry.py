"""The policy registry in the database: migration 0007 over existing rows (and back),
registration by content hash, one active and one shadow version, rollback that walks
back, failures recorded with the reason, shadow decisions that are never a job's current
one (not for readers, not for retention), and the shadow's metrics summarised over
their JSON labels; on SQLite and, where one is at hand, on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from autotune.core import Decision, JobConfig, JobSpec, Placement, RankSlot
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.engine import MIGRATIONS
from autotune.db.retention import RetentionPolicy, run_retention

NEW_COLUMNS = {"name", "content_hash", "shadow", "activated_at"}
H1, H2, H3 = ("1" * 64, "2" * 64, "3" * 64)


def _columns(database: Database, table: str) -> set[str]:
    with database.engine.connect() as connection:
        return {c["name"] for c in inspect(connection).get_columns(table)}


def test_0007_adds_names_hashes_events_and_goes_back(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "old.db"))
    database.upgrade("0006_transitions")
    assert not _columns(database, "policy_versions") & NEW_COLUMNS
    with database.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO policy_versions (version, kind, checkpoint_path, active, metrics, "
            "created_at) VALUES ('ppo-0.1.0', 'ppo', NULL, 1, '{}', '2026-11-01 10:00:00')"
        )
    database.upgrade()
    assert database.current_revision() == "0014_job_events"
    assert _columns(database, "policy_versions") >= NEW_COLUMNS
    with database.session() as session:
        (old,) = repo.list_policy_versions(session=session)
        assert (old.name, old.state, old.shadow, old.content_hash) == (
            "ppo-0.1.0",
            "active",
            False,
            None,
        )
        assert repo.list_policy_events(session=session) == []
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0006_transitions")
    assert not _columns(database, "policy_versions") & NEW_COLUMNS
    with database.engine.connect() as connection:
        assert "policy_events" not in inspect(connection).get_table_names()
    database.dispose()


def _register(database: Database, content_hash: str, name: str) -> str:
    with database.session() as session:
        record, _ = repo.register_policy(
            session=session,
            kind="ppo",
            checkpoint_path=f"/ckpt/{name}",
            content_hash=content_hash,
            name=name,
        )
    return record.version


def test_registration_is_by_content_and_one_version_is_active(any_database: Database) -> None:
    database = any_database
    first = _register(database, H1, "first")
    assert first == f"ppo-{H1[:12]}"
    with database.session() as session:
        again, created = repo.register_policy(
            session=session, kind="bc", checkpoint_path="/elsewhere", content_hash=H1, name="x"
        )
        assert not created
        assert (again.version, again.name, again.checkpoint_path) == (first, "first", "/ckpt/first")
    second = _register(database, H2, "second")
    with database.session() as session:
        repo.activate_policy(session=session, version=first)
        repo.activate_policy(session=session, version=second)
        states = {r.version: r.state for r in repo.list_policy_versions(session=session)}
        assert states == {first: "registered", second: "active"}
        with pytest.raises(repo.PolicyNotFoundError):
            repo.activate_policy(session=session, version="nope")
        repo.register_policy_version(session=session, version="ppo-fallback", kind="ppo")
        with pytest.raises(repo.PolicyConflictError, match="no checkpoint"):
            repo.activate_policy(session=session, version="ppo-fallback")
        repo.register_policy_version(session=session, version="rules-1", kind="rules")
        repo.activate_policy(session=session, version="rules-1")  # the rules need none
        active, shadow = repo.policy_state(session=session)
        assert active is not None
        assert active.version == "rules-1"
        assert active.activated_at is not None
        assert shadow is None


def test_rollback_walks_back_through_the_activations(any_database: Database) -> None:
    database = any_database
    a, b, c = (_register(database, h, n) for h, n in ((H1, "a"), (H2, "b"), (H3, "c")))
    with database.session() as session:
        with pytest.raises(repo.PolicyConflictError, match="no active"):
            repo.rollback_policy(session=session)
        for version in (a, b, c):
            repo.activate_policy(session=session, version=version)
        assert repo.rollback_policy(session=session).version == b
        assert repo.rollback_policy(session=session).version == a
        with pytest.raises(repo.PolicyConflictError, match="no version was active before"):
            repo.rollback_policy(session=session)
        repo.activate_policy(session=session, version=c)
        assert repo.rollback_policy(session=session).version == a  # back to what was before c
        events = repo.list_policy_events(session=session)
    assert [e.action for e in events[:2]] == ["rollback", "activate"]
    assert events[0].detail["rolled_back"] == c


def test_one_shadow_never_the_active_one_and_failures_say_why(any_database: Database) -> None:
    database = any_database
    a, b, c = (_register(database, h, n) for h, n in ((H1, "a"), (H2, "b"), (H3, "c")))
    with database.session() as session:
        repo.activate_policy(session=session, version=a)
        with pytest.raises(repo.PolicyConflictError, match="active one"):
            repo.set_shadow_policy(session=session, version=a)
        repo.set_shadow_policy(session=session, version=b)
        repo.set_shadow_policy(session=session, version=c)  # replaces b
        states = {r.version: r.state for r in repo.list_policy_versions(session=session)}
        assert states == {a: "active", b: "registered", c: "shadow"}
        repo.activate_policy(session=session, version=c)  # the candidate decides now
        active, shadow = repo.policy_state(session=session)
        assert active is not None
        assert active.version == c
        assert shadow is None
        assert repo.clear_shadow_policy(session=session) is None
        # c does not load: a decides again and the registry says why.
        repo.record_policy_failure(
            session=session, version=c, action="activate_failed", reason="gone", kept=a
        )
        active, _ = repo.policy_state(session=session)
        assert active is not None
        assert active.version == a
        failed = repo.get_policy_version(session=session, version=c)
        assert failed is not None
        assert failed.last_error == "gone"
        repo.set_shadow_policy(session=session, version=c)
        assert repo.get_policy_version(session=session, version=c).last_error is None  # type: ignore[union-attr]
        repo.record_policy_failure(
            session=session, version=c, action="shadow_failed", reason="still gone", kept=a
        )
        _, shadow = repo.policy_state(session=session)
        assert shadow is None


def _decision(job_id: str, source: str, world: int, at: datetime) -> Decision:
    placement = Placement(
        job_id=job_id,
        ranks=tuple(RankSlot(rank=r, node_id="n0", gpu_index=r) for r in range(world)),
    )
    return Decision(
        job_id=job_id,
        config=JobConfig.data_parallel(world),
        placement=placement,
        source=source,  # type: ignore[arg-type]
        policy_version="ppo-shadow" if source == "shadow" else "ppo-active",
        reason="test",
        decided_at=at,
    )


def test_shadow_decisions_are_never_a_jobs_current_one(any_database: Database) -> None:
    database = any_database
    long_ago = datetime(2026, 1, 1, tzinfo=UTC)
    with database.session() as session:
        repo.upsert_job(session=session, spec=JobSpec(job_id="j"), state="running")
        (taken,) = repo.create_decisions(
            session=session, decisions=[(_decision("j", "policy", 1, long_ago), None, None)]
        )
        repo.mark_decision_applied(session=session, decision_ids=[taken.decision_id or 0])
        repo.create_decisions(
            session=session,
            decisions=[
                (_decision("j", "shadow", 2, long_ago + timedelta(minutes=m)), None, None)
                for m in (1, 2)
            ],
        )
    with database.session() as session:
        (latest,) = repo.latest_decision_records(session=session).values()
        assert latest.decision.decision_id == taken.decision_id
        assert repo.latest_decisions(session=session)["j"].source == "policy"
        assert repo.running_placements(session=session)["j"].world_size == 1
        listed = repo.list_decisions(session=session)
        assert [r.decision.source for r in listed.rows] == ["policy"]
        assert repo.list_decisions(session=session, source="shadow").count == 2
        by_version = repo.list_decisions(
            session=session, source="shadow", policy_version="ppo-shadow"
        )
        assert by_version.count == 2
        assert repo.list_decisions(session=session, policy_version="ppo-active").count == 1
    # Retention deletes the old shadow rows but keeps the decision the job runs under.
    policy = RetentionPolicy(decisions_days=30, metrics_days=None, metrics_full_days=None)
    run_retention(database, policy, long_ago + timedelta(days=60))
    with database.session() as session:
        left = repo.list_decisions(session=session).rows
        assert [r.decision.decision_id for r in left] == [taken.decision_id]
        assert repo.list_decisions(session=session, source="shadow").count == 0


def test_shadow_metrics_are_summarised_over_their_labels(any_database: Database) -> None:
    database = any_database
    start = datetime(2026, 6, 1, tzinfo=UTC)
    with database.session() as session:
        repo.record_metrics(  # retention's downsampled row: the mean of 4 rounds
            session=session,
            values=[("shadow_agreement", 0.25, None)],
            labels={"shadow": "v1", "active": "v0", "downsampled_s": 60, "downsampled_n": 4},
            at=start - timedelta(days=2),
        )
        for i, value in enumerate([1.0, 0.5, 0.0, 1.0]):
            repo.record_metrics(
                session=session,
                values=[("shadow_agreement", value, None)],
                labels={"shadow": "v1", "active": "v0"},
                at=start + timedelta(seconds=i),
            )
        repo.record_metrics(
            session=session,
            values=[("shadow_agreement", 0.0, None)],
            labels={"shadow": "other", "active": "v0"},
            at=start,
        )
        everything = repo.summarize_metric(
            session=session, name="shadow_agreement", label="shadow", value="v1", recent=2
        )
        since = repo.summarize_metric(
            session=session,
            name="shadow_agreement",
            label="shadow",
            value="v1",
            since=start,
            recent=2,
        )
    assert everything.rounds == 8
    assert everything.mean == pytest.approx((2.5 + 0.25 * 4) / 8)
    assert everything.recent_mean == pytest.approx(0.5)  # the newest two: 0.0 and 1.0
    assert since.rounds == 4
    assert since.mean == pytest.approx(0.625)
