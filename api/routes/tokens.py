"""API tokens: issued to a tenant with a role, listed, rotated and revoked by an admin's
token; any valid token may ask who it is (``/whoami``). The token itself is in the
answer that issues or rotates it, and nowhere else."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from autotune.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    MAX_ROW_ID,
    READ_ERRORS,
    WRITE_ERRORS,
    AdminDep,
    AdminTokenDep,
    IdPath,
    PrincipalDep,
    SessionDep,
    problem,
    unprocessable,
)
from autotune.api.schemas import (
    PrincipalPublic,
    TokenCreate,
    TokenIssued,
    TokenPublic,
    TokensPublic,
)
from autotune.core import ID_PATTERN, utc_now
from autotune.daemon.auth import TokenCheck, issue_token, rotate_stored_token
from autotune.db import repository as repo

router = APIRouter(prefix="/tokens", tags=["tokens"])
whoami_router = APIRouter(tags=["tokens"])
_NO_TOKEN: dict[int | str, dict[str, Any]] = {404: problem("No token with that id")}


def _public(record: repo.TokenRecord) -> dict[str, Any]:
    return {
        "id": record.token_id,
        "tenant": record.tenant,
        "role": record.role,
        "name": record.name,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "revoked_at": record.revoked_at,
        "rotated_at": record.rotated_at,
        "created_by": record.created_by,
        "usable": record.usable_at(utc_now()),
    }


def _changed(request: Request) -> None:
    """This daemon's token check reads the stored tokens again at the next request
    (other daemons sharing the database within their refresh)."""
    check: TokenCheck | None = request.app.state.token_check
    if check is not None:
        check.invalidate()


@whoami_router.get(
    "/whoami", response_model=PrincipalPublic, responses={**READ_ERRORS, **AUTH_ERRORS}
)
def whoami(principal: PrincipalDep) -> PrincipalPublic:
    """Who the presented token is: its tenant, role, id and name."""
    return PrincipalPublic(
        tenant=principal.tenant,
        role=principal.role,
        token_id=principal.token_id,
        token_name=principal.token_name,
    )


@router.get(
    "",
    response_model=TokensPublic,
    dependencies=[AdminTokenDep],
    responses={**READ_ERRORS, **AUTH_ERRORS},
)
def list_tokens(
    session: SessionDep,
    tenant: Annotated[str | None, Query(pattern=ID_PATTERN, description="Only its")] = None,
    revoked: Annotated[bool, Query(description="Include revoked tokens")] = False,
) -> TokensPublic:
    """Tokens by id, without their secrets (an admin's token)."""
    records = repo.list_tokens(session=session, tenant=tenant, revoked=revoked)
    return TokensPublic(data=[TokenPublic(**_public(r)) for r in records])


@router.post(
    "",
    response_model=TokenIssued,
    status_code=201,
    responses=BODY_ERRORS,
)
def create_token(
    session: SessionDep, request: Request, body: TokenCreate, principal: AdminDep
) -> TokenIssued:
    """Issue a token to a tenant with a role (an admin's token). The answer holds the
    token itself, once: only its hash is stored."""
    if repo.get_tenant(session=session, name=body.tenant) is None:
        raise unprocessable("tenant", f"no tenant {body.tenant!r} (POST /tenants first)")
    expires_at = (
        None if body.expires_in_s is None else utc_now() + timedelta(seconds=body.expires_in_s)
    )
    record, token = issue_token(
        session,
        tenant=body.tenant,
        role=body.role,
        name=body.name,
        expires_at=expires_at,
        created_by=principal.token_id,
    )
    _changed(request)
    return TokenIssued(**_public(record), token=token)


@router.post(
    "/{token_id}/rotate",
    response_model=TokenIssued,
    dependencies=[AdminTokenDep],
    responses={**WRITE_ERRORS, **_NO_TOKEN, 409: problem("The token is revoked")},
)
def rotate_token(session: SessionDep, request: Request, token_id: IdPath) -> TokenIssued:
    """Give a token a new secret (an admin's token): same id, tenant, role and expiry;
    the old secret stops working at once. The answer holds the new token, once."""
    record = None
    if token_id <= MAX_ROW_ID:  # none has a larger id (a query for one is an error)
        record = repo.get_token(session=session, token_id=token_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no token {token_id}")
    rotated = rotate_stored_token(session, token_id)
    if rotated is None:
        raise HTTPException(status_code=409, detail=f"token {token_id} is revoked")
    _changed(request)
    new_record, token = rotated
    return TokenIssued(**_public(new_record), token=token)


@router.delete(
    "/{token_id}",
    response_model=TokenPublic,
    dependencies=[AdminTokenDep],
    responses={**WRITE_ERRORS, **_NO_TOKEN},
)
def revoke_token(session: SessionDep, request: Request, token_id: IdPath) -> TokenPublic:
    """Revoke a token (an admin's token): it stops working at once; its row stays, so
    the audit log still says whose it was."""
    record = (
        repo.revoke_token(session=session, token_id=token_id) if token_id <= MAX_ROW_ID else None
    )
    if record is None:
        raise HTTPException(status_code=404, detail=f"no token {token_id}")
    _changed(request)
    return TokenPublic(**_public(record))
