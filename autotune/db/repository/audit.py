"""The audit log: every mutating API request, who asked (token, tenant, role) and the
answer's status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from autotune.db.repository.cursor import decode_cursor, encode_cursor
from autotune.db.repository.paging import Page, bounded_count
from autotune.db.tables import AuditRow

__all__ = ["AuditRecord", "list_audit", "record_audit"]


@dataclass(frozen=True, slots=True)
class AuditRecord:
    audit_id: int
    at: datetime
    token_id: int | None
    token_name: str | None
    tenant: str | None
    role: str | None
    method: str
    path: str
    status: int


def record_audit(
    *,
    session: Session,
    at: datetime,
    method: str,
    path: str,
    status: int,
    token_id: int | None = None,
    token_name: str | None = None,
    tenant: str | None = None,
    role: str | None = None,
) -> None:
    session.add(
        AuditRow(
            at=at,
            token_id=token_id,
            token_name=token_name,
            tenant=tenant,
            role=role,
            method=method[:8],
            path=path[:512],
            status=status,
        )
    )


def list_audit(
    *,
    session: Session,
    tenant: str | None = None,
    token_id: int | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Page[AuditRecord]:
    """Entries newest first, of one tenant's or one token's requests when given."""
    conditions: list[ColumnElement[bool]] = []
    if tenant is not None:
        conditions.append(AuditRow.tenant == tenant)
    if token_id is not None:
        conditions.append(AuditRow.token_id == token_id)
    count, exact = bounded_count(session, AuditRow.id, conditions)
    if cursor is not None:
        (last,) = decode_cursor(cursor, int)
        conditions.append(AuditRow.id < last)
    rows = list(
        session.scalars(
            select(AuditRow).where(*conditions).order_by(AuditRow.id.desc()).limit(limit + 1)
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        rows=[
            AuditRecord(
                audit_id=r.id,
                at=r.at,
                token_id=r.token_id,
                token_name=r.token_name,
                tenant=r.tenant,
                role=r.role,
                method=r.method,
                path=r.path,
                status=r.status,
            )
            for r in rows
        ],
        count=count,
        count_exact=exact,
        next_cursor=encode_cursor(rows[-1].id) if more and rows else None,
    )
