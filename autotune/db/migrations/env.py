"""Alembic environment: runs on the connection ``Database.upgrade`` hands it."""

from __future__ import annotations

from alembic import context

from autotune.db.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `autotune db upgrade` (Database.upgrade)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
