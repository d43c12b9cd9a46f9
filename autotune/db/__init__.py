"""Storage: typed tables, migrations and keyword-only repository functions."""

from autotune.db.engine import Database, make_engine, sqlite_url

__all__ = ["Database", "make_engine", "sqlite_url"]
