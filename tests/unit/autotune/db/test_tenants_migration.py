"""Migration 0013 (tenants, scoped tokens, the audit log) over a database that holds a
token and a job: the token becomes an admin of the ``default`` tenant and still opens
the API, the job becomes ``default``'s; and it goes back down, keeping the token."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from autotune.daemon.auth import Principal, StoredTokenCheck, hash_token
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.engine import MIGRATIONS

BEFORE = "0012_transition_exports"
TOKEN = "an-old-token-stored-before-tenants-0123456789"
NEW_TOKEN_COLUMNS = {
    "tenant",
    "role",
    "name",
    "expires_at",
    "revoked_at",
    "rotated_at",
    "created_by",
}
NEW_TABLES = {"tenants", "audit_log"}


def _columns(database: Database, table: str) -> set[str]:
    with database.engine.connect() as connection:
        return {c["name"] for c in inspect(connection).get_columns(table)}


def _tables(database: Database) -> set[str]:
    with database.engine.connect() as connection:
        return set(inspect(connection).get_table_names())


def test_0013_makes_the_stored_token_defaults_admin_and_goes_back(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "old.db"))
    database.upgrade(BEFORE)
    assert not _tables(database) & NEW_TABLES
    assert not _columns(database, "api_tokens") & NEW_TOKEN_COLUMNS
    assert "tenant" not in _columns(database, "jobs")
    with database.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO api_tokens (token_sha256, created_at) VALUES (?, ?)",
            (hash_token(TOKEN), "2026-11-01 09:00:00"),
        )
        connection.exec_driver_sql(
            "INSERT INTO jobs (job_id, spec, state, state_reason, progress, submitted_at, "
            "updated_at) VALUES ('old', '{\"job_id\": \"old\"}', 'running', '', 0.5, "
            "'2026-11-01 10:00:00', '2026-11-01 11:00:00')"
        )
        (token_id,) = connection.exec_driver_sql("SELECT id FROM api_tokens").one()

    database.upgrade()
    assert database.current_revision() == "0014_job_events"
    assert _tables(database) >= NEW_TABLES
    with database.engine.connect() as connection:
        row = connection.exec_driver_sql(
            "SELECT tenant, role, name, expires_at, revoked_at, rotated_at, created_by "
            "FROM api_tokens WHERE id = ?",
            (token_id,),
        ).one()
        assert tuple(row) == ("default", "admin", "", None, None, None, None)
        (job_tenant,) = connection.exec_driver_sql(
            "SELECT tenant FROM jobs WHERE job_id = 'old'"
        ).one()
        assert job_tenant == "default"
    with database.session() as session:
        token = repo.get_token(session=session, token_id=token_id)
        assert token is not None
        assert (token.tenant, token.role, token.name) == ("default", "admin", "")
        assert token.expires_at is None
        assert token.revoked_at is None
        job = repo.get_job(session=session, job_id="old")
        assert job is not None
        assert job.spec.tenant == "default"
        assert job.state == "running"
        (tenant,) = repo.list_tenants(session=session)
        assert tenant.spec.name == "default"
        assert tenant.spec.gpus == 0
        assert tenant.spec.gpus_by_model == {}
        assert tenant.spec.borrow is True
        assert tenant.spec.lend is True
        assert tenant.spec.weight == 1.0
        assert repo.list_jobs(session=session, tenant="default").count == 1
    # The token a client already holds opens the API as before, now as default's admin.
    check = StoredTokenCheck(database)
    assert check(TOKEN) == Principal(
        tenant="default", role="admin", token_id=token_id, token_name=""
    )
    assert check(TOKEN + "x") is None

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, BEFORE)
    assert database.current_revision() == BEFORE
    assert not _tables(database) & NEW_TABLES
    assert _columns(database, "api_tokens") == {"id", "token_sha256", "created_at"}
    assert "tenant" not in _columns(database, "jobs")
    with database.engine.connect() as connection:
        tokens = connection.exec_driver_sql("SELECT id, token_sha256 FROM api_tokens").all()
        assert [tuple(t) for t in tokens] == [(token_id, hash_token(TOKEN))]
        jobs = connection.exec_driver_sql("SELECT job_id FROM jobs").all()
        assert [tuple(j) for j in jobs] == [("old",)]

    # And up again: the downgrade left a schema the upgrade takes.
    database.upgrade()
    assert StoredTokenCheck(database)(TOKEN) == Principal(
        tenant="default", role="admin", token_id=token_id, token_name=""
    )
    database.dispose()
