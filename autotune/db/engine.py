"""Engines, sessions and migrations.

SQLite is the embedded default: one file in the data directory, in WAL mode so the API
reads while the decision loop writes, with foreign keys enforced. Any SQLAlchemy URL
(PostgreSQL: ``postgresql+psycopg://...``) works the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from autotune.errors import InputError

__all__ = ["Database", "make_engine", "sqlite_url"]

MIGRATIONS = Path(__file__).parent / "migrations"


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def make_engine(
    url: str, *, pool_size: int | None = None, pool_timeout_s: float | None = None
) -> Engine:
    """An engine for ``url``; for SQLite: WAL journal, foreign keys, a busy timeout.

    ``pool_size``: connections kept open (and the most handed out at once: no overflow);
    ``pool_timeout_s``: how long a caller waits for one before ``sqlalchemy.exc.
    TimeoutError`` (the API answers 503). ``None``: SQLAlchemy's defaults (5 + 10
    overflow, 30 s)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InputError(f"not a database URL: {url!r}") from exc
    kwargs: dict[str, Any] = {}
    file_backed = True
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        file_backed = bool(database) and database != ":memory:"
        if file_backed:
            assert database is not None
            parent = Path(database).expanduser().parent
            if not parent.is_dir():
                raise InputError(f"directory of the database does not exist: {parent}")
        # The API serves requests from a thread pool; SQLite connections may cross threads
        # because every session is used by one thread at a time.
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    if file_backed and pool_size is not None:
        kwargs.update(pool_size=pool_size, max_overflow=0)
    if file_backed and pool_timeout_s is not None:
        kwargs["pool_timeout"] = pool_timeout_s
    try:
        engine = create_engine(parsed, **kwargs)
    except Exception as exc:  # missing driver, bad options
        raise InputError(f"cannot open database {parsed!r}: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

    return engine


class Database:
    """The engine and a session factory; ``session()`` commits or rolls back.

    A process that both decides and serves opens two: the decision loop's own (so it
    never waits behind readers for a connection) and the API's."""

    def __init__(
        self, url: str, *, pool_size: int | None = None, pool_timeout_s: float | None = None
    ) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size, pool_timeout_s=pool_timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed when the block ends, rolled back if it raises."""
        with self._sessions() as session, session.begin():
            yield session

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with the packaged Alembic migrations."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def dispose(self) -> None:
        self.engine.dispose()
