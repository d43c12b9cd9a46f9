"""The audit log: every mutating request, the token that made it and the answer's
status, refusals included. Read with an admin's token."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Request

from autotune.api.deps import (
    AUTH_ERRORS,
    MAX_ROW_ID,
    READ_ERRORS,
    AdminTokenDep,
    CursorQuery,
    bad_cursor,
    in_session,
)
from autotune.api.schemas import AuditEntryPublic, AuditPublic
from autotune.core import ID_PATTERN
from autotune.db import repository as repo

router = APIRouter(prefix="/audit", tags=["tokens"])


@router.get(
    "",
    response_model=AuditPublic,
    dependencies=[AdminTokenDep],
    responses={**READ_ERRORS, **AUTH_ERRORS},
)
async def list_audit(
    request: Request,
    tenant: Annotated[
        str | None, Query(pattern=ID_PATTERN, description="Only this tenant's tokens'")
    ] = None,
    token_id: Annotated[int | None, Query(ge=1, le=MAX_ROW_ID, description="Only its")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: CursorQuery = None,
) -> AuditPublic:
    """Mutating requests newest first: when, which token (tenant, role), what, and the
    status answered (an admin's token)."""
    with bad_cursor():
        page = await in_session(
            request,
            lambda session: repo.list_audit(
                session=session, tenant=tenant, token_id=token_id, limit=limit, cursor=cursor
            ),
        )
    return AuditPublic(
        data=[AuditEntryPublic.model_validate({**asdict(r), "id": r.audit_id}) for r in page.rows],
        count=page.count,
        count_exact=page.count_exact,
        next=page.next_cursor,
    )
