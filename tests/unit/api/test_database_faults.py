"""A SQLite database that fills up or is read-only: a clear error at start, and during the
run 503s that say why and ticks that pause, then resume once there is room again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import cli
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from autotune.api.app import attach_daemon, create_app
from autotune.daemon.auth import TokenCheck, hash_token
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database, sqlite_url
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy

TOKEN = "full-disk-token"


class Quota:
    """SQLite's page quota on every connection of some databases: ``full()`` lets none of
    them grow (SQLITE_FULL, as on a full disk), ``room()`` lifts it."""

    def __init__(self, *databases: Database) -> None:
        self.databases = databases
        self.limit: int | None = None
        for database in databases:
            event.listen(database.engine, "connect", self._on_connect)

    def _on_connect(self, connection: Any, _record: Any) -> None:
        if self.limit is not None:
            cursor = connection.cursor()
            cursor.execute(f"PRAGMA max_page_count = {self.limit}")
            cursor.close()

    def _apply(self, limit: int | None) -> None:
        self.limit = limit
        for database in self.databases:
            database.engine.dispose()  # new connections take the quota

    def full(self) -> None:
        with self.databases[0].engine.connect() as connection:
            pages = connection.exec_driver_sql("PRAGMA page_count").scalar_one()
        self._apply(int(pages))

    def room(self) -> None:
        self._apply(None)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Daemon, TestClient, Quota]]:
    url = sqlite_url(tmp_path / "autotune.db")
    database = Database(url)
    database.upgrade()
    api_db = Database(url)
    daemon = Daemon(
        DaemonParts(
            db=database,
            backend=SimulatedCluster(SimConfig(seed=0, initial_jobs=4, max_jobs=40)),
            policy=RulesPolicy(),
            fallback=RulesPolicy(),
        )
    )
    daemon.start()
    app = create_app(db=api_db, telemetry="simulator", token_check=TokenCheck([hash_token(TOKEN)]))
    attach_daemon(app, daemon)
    with TestClient(app) as client:
        yield daemon, client, Quota(database, api_db)
    api_db.dispose()
    database.dispose()


def test_a_full_database_pauses_ticks_and_answers_503_saying_why(
    service: tuple[Daemon, TestClient, Quota],
) -> None:
    daemon, client, quota = service
    for _ in range(3):
        daemon.tick()
    quota.full()
    for _ in range(500):  # the pages fill up within a few ticks (metrics, jobs, decisions)
        try:
            daemon.tick()
        except OperationalError:
            break
    else:
        pytest.fail("the database never filled up")
    with pytest.raises(OperationalError, match="database or disk is full"):
        daemon.tick()
    assert daemon.health.paused is not None
    assert "database or disk is full" in daemon.health.paused
    assert daemon.health.consecutive_failures == 0  # not the policy's fault: no fallback
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(500):  # until a write needs a page the quota refuses
        created = client.post(
            "/api/v1/jobs", json={"task": "gpt-char", "steps": 10}, headers=headers
        )
        if created.status_code != 201:
            break
    assert created.status_code == 503
    assert "database or disk is full" in created.json()["detail"]
    assert created.headers["Retry-After"] == "1"
    ready = client.get("/api/v1/readyz")
    assert ready.status_code == 503
    assert any("database or disk is full" in reason for reason in ready.json()["reasons"])
    assert client.get("/api/v1/decisions").status_code == 200  # reads still work
    quota.room()
    daemon.tick()
    assert daemon.health.ok
    assert client.get("/api/v1/readyz").status_code == 200
    created = client.post("/api/v1/jobs", json={"task": "gpt-char", "steps": 10}, headers=headers)
    assert created.status_code == 201


def test_a_read_only_database_is_refused_at_start_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "autotune.db"
    Database(sqlite_url(path)).upgrade()
    result = cli("daemon", "--db", f"sqlite:///file:{path}?mode=ro&uri=true")
    assert result.exit_code == 2, result.output
    assert "cannot be written: OperationalError: attempt to write a readonly database" in (
        result.output
    )


def test_too_little_free_disk_is_refused_at_start(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "autotune.db"))
    database.upgrade()
    with pytest.raises(ValueError, match=r"MiB free on its disk"):
        database.check_writable(min_free_bytes=2**62)
    database.check_writable()  # this disk has room
