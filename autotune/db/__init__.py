"""Storage: typed tables, migrations and keyword-only repository functions."""

from autotune.db.engine import Database, database_error, make_engine, sqlite_file, sqlite_url

__all__ = ["Database", "database_error", "make_engine", "sqlite_file", "sqlite_url"]
