"""Migration 0003 (job start and end times) keeps the jobs a database already holds, and
goes back down."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from autotune.core import JobSpec
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.engine import MIGRATIONS

TIME_COLUMNS = {"started_at", "finished_at", "sim_submitted_s", "sim_started_s", "sim_finished_s"}


def _columns(database: Database) -> set[str]:
    with database.engine.connect() as connection:
        return {c["name"] for c in inspect(connection).get_columns("jobs")}


def test_0003_adds_the_job_times_to_existing_jobs_and_goes_back(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "old.db"))
    database.upgrade("0002")
    assert not _columns(database) & TIME_COLUMNS
    with database.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO jobs (job_id, spec, state, state_reason, progress, submitted_at, "
            "updated_at) VALUES ('old', '{\"job_id\": \"old\"}', 'finished', '', 1.0, "
            "'2026-11-01 10:00:00', '2026-11-01 11:00:00')"
        )
    database.upgrade("0003")
    assert database.current_revision() == "0003"
    assert _columns(database) >= TIME_COLUMNS
    database.upgrade()  # the ORM maps the newest schema (later revisions add job columns)
    with database.session() as session:
        record = repo.get_job(session=session, job_id="old")
        assert record is not None
        assert record.state == "finished"
        assert record.started_at is None
        assert record.finished_at is None
        assert record.jct_s is None  # finished before the daemon kept the times
        repo.upsert_job(session=session, spec=JobSpec(job_id="new"), state="running")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
    assert database.current_revision() == "0002"
    assert not _columns(database) & TIME_COLUMNS
    database.dispose()
