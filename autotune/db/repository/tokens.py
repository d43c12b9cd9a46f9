"""API tokens, stored as SHA-256 digests (never the tokens themselves)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autotune.core import utc_now
from autotune.db.tables import ApiTokenRow

__all__ = ["add_token_hash", "replace_token_hashes", "token_hashes"]


def token_hashes(*, session: Session) -> list[str]:
    """SHA-256 hex digests of the stored API tokens."""
    return list(session.scalars(select(ApiTokenRow.token_sha256)))


def add_token_hash(*, session: Session, token_sha256: str) -> None:
    session.add(ApiTokenRow(token_sha256=token_sha256, created_at=utc_now()))


def replace_token_hashes(*, session: Session, token_sha256: str) -> int:
    """Make ``token_sha256`` the only stored token; returns how many were removed."""
    removed = len(session.scalars(delete(ApiTokenRow).returning(ApiTokenRow.id)).all())
    add_token_hash(session=session, token_sha256=token_sha256)
    return removed
