"""Nodes the backend reports gone are kept as lost (migration 0004), and come back."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from autotune.catalog.devices import node_info
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.engine import MIGRATIONS


def _columns(database: Database) -> set[str]:
    with database.engine.connect() as connection:
        return {c["name"] for c in inspect(connection).get_columns("nodes")}


def test_0004_keeps_existing_nodes_alive_and_goes_back(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "old.db"))
    database.upgrade("0003")
    with database.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO nodes (node_id, gpu_model, gpu_count, info, updated_at) VALUES "
            "('old', 'A100', 8, '{}', '2026-11-01 10:00:00')"
        )
    database.upgrade("0004")
    assert database.current_revision() == "0004"
    with database.engine.connect() as connection:
        rows = connection.exec_driver_sql("SELECT state, lost_at FROM nodes").all()
    assert [tuple(r) for r in rows] == [("alive", None)]
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
    assert not _columns(database) & {"state", "lost_at"}
    database.dispose()


def test_a_lost_node_is_kept_apart_and_comes_back(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "n.db"))
    database.upgrade()
    a, b = (
        node_info("a", gpu_model="A100", gpu_count=8, cpu_milli=8000, memory_mib=1024),
        node_info("b", gpu_model="A100", gpu_count=8, cpu_milli=8000, memory_mib=1024),
    )
    with database.session() as session:
        assert repo.upsert_nodes(session=session, nodes=[a, b]) == []
    with database.session() as session:
        assert repo.upsert_nodes(session=session, nodes=[a], lost=[b]) == ["b"]
        assert repo.upsert_nodes(session=session, nodes=[a], lost=[b]) == []  # once
    with database.session() as session:
        assert [n.node_id for n in repo.list_nodes(session=session)] == ["a"]
        records = {r.info.node_id: r for r in repo.node_records(session=session)}
        assert records["b"].state == "lost"
        assert records["b"].lost_at is not None
        assert records["a"].state == "alive"
        assert records["a"].lost_at is None
    with database.session() as session:
        repo.upsert_nodes(session=session, nodes=[a, b])
        assert [n.node_id for n in repo.list_nodes(session=session)] == ["a", "b"]
        assert all(r.state == "alive" for r in repo.node_records(session=session))
    database.dispose()
