"""Engines, sessions and migrations.

SQLite is the embedded default: one file in the data directory, in WAL mode so the API
reads while the decision loop writes, with foreign keys enforced. Any SQLAlchemy URL
(PostgreSQL: ``postgresql+psycopg://...``) works the same way.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from autotune.errors import InputError

__all__ = ["Database", "database_error", "make_engine", "sqlite_file", "sqlite_url"]

MIGRATIONS = Path(__file__).parent / "migrations"
CONNECT_TIMEOUT_S = 5
"""Seconds a new PostgreSQL connection may take."""
MIN_FREE_BYTES = 64 * 2**20
"""Free disk a SQLite database needs at start (``Database.check_writable``)."""
_LOCK_KEY = 0x6175746F74756E65  # "autotune": PostgreSQL's advisory lock for migrations


def database_error(exc: BaseException) -> str:
    """``Type: message`` of a database error, from the driver's own exception where
    there is one, first line only (no SQL, no parameters)."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {lines[0][:300]}" if lines else type(orig).__name__


def sqlite_file(url: str) -> Path | None:
    """The file of a file-backed SQLite URL (``None``: another database, or in memory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    database = parsed.database
    if database == ":memory:" or "mode=memory" in database:
        return None
    if database.startswith("file:"):  # a URI filename (?uri=true)
        database = database[len("file:") :].split("?", 1)[0]
    return Path(database).expanduser()


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
        file = sqlite_file(url)
        file_backed = file is not None
        if file is not None:
            parent = file.parent
            if not parent.is_dir():
                raise InputError(f"directory of the database does not exist: {parent}")
        # The API serves requests from a thread pool; SQLite connections may cross threads
        # because every session is used by one thread at a time.
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    elif parsed.get_backend_name() == "postgresql":
        # A server that is down or unreachable fails a connection in seconds (the API
        # answers 503), and a connection the server dropped (restarted) is noticed and
        # replaced before a request uses it.
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
        kwargs["pool_pre_ping"] = True
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
        """Bring the schema to ``revision`` with the packaged Alembic migrations; daemons
        starting together on one database migrate it one at a time."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self._migration_lock(), self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":  # held until this transaction ends
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    @contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """On a SQLite file: an exclusive lock on ``<file>.migrate.lock``."""
        path = sqlite_file(self.url)
        if path is None:
            yield
            return
        import fcntl

        with open(f"{path}.migrate.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def prepare(self) -> None:
        """What a daemon does first: migrate to the newest schema and check that the
        database takes writes; ``InputError`` with the reason when it cannot be reached,
        migrated or written."""
        try:
            self.upgrade()
        except DBAPIError as exc:
            raise InputError(f"database {self._shown()}: {database_error(exc)}") from None
        self.check_writable()

    def _shown(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def check_writable(self, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        """``InputError`` saying why when the database cannot take writes: unreachable,
        read-only (file, mount or role), or, for a SQLite file, less than
        ``min_free_bytes`` left on its disk. Writes nothing."""
        shown = self._shown()
        path = sqlite_file(self.url)
        if path is not None:
            free = shutil.disk_usage(path.parent).free
            if free < min_free_bytes:
                raise InputError(
                    f"database {shown}: only {free / 2**20:.0f} MiB free on its disk "
                    f"(at least {min_free_bytes / 2**20:.0f} MiB needed); free some space"
                )
        try:
            with self.engine.connect() as connection, connection.begin() as transaction:
                # Rewrites one row as it is: any write the database refuses fails here.
                connection.execute(text("UPDATE leader_lease SET term = term"))
                transaction.rollback()
        except DBAPIError as exc:
            raise InputError(f"database {shown} cannot be written: {database_error(exc)}") from None

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def dispose(self) -> None:
        self.engine.dispose()
