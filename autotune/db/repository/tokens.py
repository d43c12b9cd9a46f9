"""API tokens, stored as SHA-256 digests (never the tokens themselves), each with its
tenant, role, name and expiry; revoked tokens keep their rows for the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autotune.core import DEFAULT_TENANT, utc_now
from autotune.db.tables import ApiTokenRow

__all__ = [
    "TokenRecord",
    "add_token",
    "first_admin_token",
    "get_token",
    "list_tokens",
    "revoke_token",
    "rotate_token_hash",
    "usable_tokens",
]


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A stored token, without its digest."""

    token_id: int
    tenant: str
    role: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_at: datetime | None
    created_by: int | None

    def usable_at(self, at: datetime) -> bool:
        """Neither revoked nor expired at ``at``."""
        return self.revoked_at is None and (self.expires_at is None or at < self.expires_at)


def _record(row: ApiTokenRow) -> TokenRecord:
    return TokenRecord(
        token_id=row.id,
        tenant=row.tenant,
        role=row.role,
        name=row.name,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        rotated_at=row.rotated_at,
        created_by=row.created_by,
    )


def usable_tokens(*, session: Session) -> list[tuple[str, TokenRecord]]:
    """``(SHA-256 hex digest, record)`` of every token not revoked (expired ones too:
    the check compares the expiry with the time of each request)."""
    rows = session.scalars(select(ApiTokenRow).where(ApiTokenRow.revoked_at.is_(None)))
    return [(row.token_sha256, _record(row)) for row in rows]


def add_token(
    *,
    session: Session,
    token_sha256: str,
    tenant: str = DEFAULT_TENANT,
    role: str = "admin",
    name: str = "",
    expires_at: datetime | None = None,
    created_by: int | None = None,
) -> TokenRecord:
    """Store a new token's digest; the tenant must exist (a foreign key)."""
    row = ApiTokenRow(
        token_sha256=token_sha256,
        created_at=utc_now(),
        tenant=tenant,
        role=role,
        name=name,
        expires_at=expires_at,
        revoked_at=None,
        rotated_at=None,
        created_by=created_by,
    )
    session.add(row)
    session.flush()
    return _record(row)


def get_token(*, session: Session, token_id: int) -> TokenRecord | None:
    row = session.get(ApiTokenRow, token_id)
    return None if row is None else _record(row)


def list_tokens(
    *, session: Session, tenant: str | None = None, revoked: bool = False
) -> list[TokenRecord]:
    """Tokens by id (of one tenant, when given); the revoked ones too when ``revoked``."""
    query = select(ApiTokenRow).order_by(ApiTokenRow.id)
    if tenant is not None:
        query = query.where(ApiTokenRow.tenant == tenant)
    if not revoked:
        query = query.where(ApiTokenRow.revoked_at.is_(None))
    return [_record(row) for row in session.scalars(query)]


def first_admin_token(*, session: Session) -> TokenRecord | None:
    """The oldest admin token not revoked (the one made at the first start, unless it was
    revoked since)."""
    row = session.scalars(
        select(ApiTokenRow)
        .where(ApiTokenRow.role == "admin", ApiTokenRow.revoked_at.is_(None))
        .order_by(ApiTokenRow.id)
        .limit(1)
    ).first()
    return None if row is None else _record(row)


def revoke_token(*, session: Session, token_id: int) -> TokenRecord | None:
    """Revoke the token (idempotent; the row stays); ``None`` when there is none."""
    row = session.get(ApiTokenRow, token_id)
    if row is None:
        return None
    if row.revoked_at is None:
        row.revoked_at = utc_now()
    return _record(row)


def rotate_token_hash(*, session: Session, token_id: int, token_sha256: str) -> TokenRecord | None:
    """Give a token a new secret (same id, tenant, role, expiry): the old secret stops
    working. ``None`` when there is no such token, or it is revoked."""
    row = session.get(ApiTokenRow, token_id)
    if row is None or row.revoked_at is not None:
        return None
    row.token_sha256 = token_sha256
    row.rotated_at = utc_now()
    return _record(row)
