"""Dependencies and errors shared by the routers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar, get_args

import anyio
from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, Field
from sqlalchemy.orm import Session

from autotune.core import ID_PATTERN
from autotune.daemon.auth import Principal, TokenCheck
from autotune.db import Database
from autotune.db.repository import CursorError

__all__ = [
    "AUTH_ERRORS",
    "BODY_ERRORS",
    "MAX_OFFSET",
    "MAX_ROW_ID",
    "READS",
    "READ_ERRORS",
    "WRITE_ERRORS",
    "AdminDep",
    "AdminTokenDep",
    "CursorQuery",
    "FieldProblem",
    "IdPath",
    "Invalid",
    "JobIdPath",
    "JobQuery",
    "OffsetQuery",
    "PrincipalDep",
    "Problem",
    "ReaderDep",
    "Reads",
    "SessionDep",
    "SinceQuery",
    "TelemetryDep",
    "TokenDep",
    "WriterDep",
    "acting_for",
    "bad_cursor",
    "every_tenant",
    "in_session",
    "problem",
    "seen_tenant",
    "unprocessable",
]

T = TypeVar("T")


def unprocessable(field: str, message: str) -> RequestValidationError:
    """A 422 for the request body's ``field`` (dotted for a nested one:
    ``constraints.gpu_milli``), answered as every validation error is: a ``message`` line
    naming the field, and FastAPI's ``detail`` list."""
    return RequestValidationError(
        [{"loc": ("body", *field.split(".")), "msg": message, "type": "value_error"}]
    )


# --- what the answers other than 2xx look like, for the OpenAPI schema ----------------


class Problem(BaseModel):
    """The body of an error answer other than 422."""

    detail: str | list[dict[str, Any]] = Field(
        description="Why, in words (413: a list of {loc, msg, type})"
    )


class FieldProblem(BaseModel):
    loc: list[str | int] = Field(description="Where: body, query or path, then the field")
    msg: str = Field(description="What is wrong with it")
    type: str


class Invalid(BaseModel):
    """A 422: a parameter or a field of the body is wrong."""

    message: str = Field(
        description="The first field that is wrong and why, e.g. 'body.min_gpus: Input should "
        "be greater than or equal to 1'"
    )
    detail: list[FieldProblem]


def problem(description: str, **headers: str) -> dict[str, Any]:
    """One documented error answer (``responses=`` of a route), with ``Problem``'s body."""
    answer: dict[str, Any] = {"model": Problem, "description": description}
    if headers:
        answer["headers"] = {
            name: {"description": why, "schema": {"type": "string"}}
            for name, why in headers.items()
        }
    return answer


READ_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": Invalid, "description": "A parameter is wrong (message names it)"},
    503: problem(
        "The database cannot answer now",
        **{"Retry-After": "Seconds to wait before retrying"},
    ),
}
"""Answers every route may give besides its own: a bad parameter, the database away."""
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **READ_ERRORS,
    401: problem(
        "No bearer token, or one unknown, revoked or expired",
        **{"WWW-Authenticate": "Bearer"},
    ),
    403: problem(
        "The token's role may not do this (a viewer's changes nothing, only an admin's "
        "manages tenants, tokens and policies), or the job is another tenant's"
    ),
}
"""Those of a mutation: it needs a token whose role and tenant allow it."""
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {k: WRITE_ERRORS[k] for k in (401, 403)}
"""The token's answers alone: for a read that needs a token (``/whoami``, ``/audit``)."""
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    **WRITE_ERRORS,
    400: problem("The body is not UTF-8 text"),
    413: problem("The body is larger than the daemon's max_body_bytes"),
    422: {
        "model": Invalid,
        "description": "A field of the body is wrong, or the body is not JSON (message "
        "names the field)",
    },
}
"""Those of a mutation with a JSON body."""


MAX_OFFSET = 10_000
"""Deepest ``offset`` a listing takes; deeper pages go by ``cursor``."""
_MAX_ID = 2**63 - 1
MAX_ROW_ID = 2**31 - 1
"""The largest id a row can have: the id columns are INTEGER, 32 bits on PostgreSQL, where
a larger id in a query is an error, not a missing row. The routes answer 404 for one
without asking the database."""

OffsetQuery = Annotated[
    int,
    Query(
        ge=0,
        le=MAX_OFFSET,
        description=f"Rows to skip (at most {MAX_OFFSET:,}; page deeper with cursor)",
    ),
]
CursorQuery = Annotated[
    str | None,
    Query(
        max_length=256,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="The previous page's next: the page right after it. Opaque: a value "
        "this listing did not hand out is a 422",
    ),
]
IdPath = Annotated[int, Path(ge=1, le=_MAX_ID)]
JobIdPath = Annotated[
    str, Path(pattern=ID_PATTERN, description="A job id: 1-128 characters of [A-Za-z0-9._:-]")
]
JobQuery = Annotated[
    str | None, Query(pattern=ID_PATTERN, description="Only this job's (a job id)")
]


_RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?"
    r"(?:[Zz]|[+-][0-9]{2}:[0-9]{2})$"
)


def _rfc3339(value: object) -> object:
    """Only what the schema's date-time is, RFC 3339 (pydantic alone would also read a
    number as seconds since 1970, or a bare date)."""
    if isinstance(value, str) and not _RFC3339.match(value):
        raise ValueError("not an RFC 3339 time with a zone, e.g. 2026-01-01T00:00:00Z")
    return value


def _in_utc(value: datetime | None) -> datetime | None:
    """``value`` in UTC, as the database compares times; 422 where it has no UTC
    equivalent (year 1 at +01:00, year 9999 at -01:00)."""
    if value is None:
        return None
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range once converted to UTC") from None


SinceQuery = Annotated[
    AwareDatetime | None,
    BeforeValidator(_rfc3339),
    AfterValidator(_in_utc),
    Query(description="Only those from this time on: ISO 8601 with a time zone, e.g. ...Z"),
]


@contextmanager
def bad_cursor() -> Iterator[None]:
    """A cursor the listing did not hand out is a 422 on ``cursor``."""
    try:
        yield
    except CursorError as exc:
        raise RequestValidationError(
            [{"loc": ("query", "cursor"), "msg": str(exc), "type": "value_error"}]
        ) from None


def _session(request: Request) -> Iterator[Session]:
    database: Database = request.app.state.db
    with database.session() as session:
        yield session


async def in_session(request: Request, work: Callable[[Session], T]) -> T:
    """``work(session)`` in one transaction, on a worker thread: the event loop never
    waits for the database (one thread hop, where a sync endpoint with ``SessionDep``
    takes three)."""
    database: Database = request.app.state.db

    def run() -> T:
        with database.session() as session:
            return work(session)

    return await anyio.to_thread.run_sync(run)


def _telemetry(request: Request) -> str:
    telemetry: str = request.app.state.telemetry
    return telemetry


_bearer = HTTPBearer(auto_error=False, description="An API token (autotune token create)")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _principal(request: Request, credentials: BearerDep) -> Principal:
    """Who sent ``Authorization: Bearer <token>``: 401 without a valid token (none,
    unknown, revoked or expired). The token is never logged; the audit log names it by
    id (``request.state.principal``)."""
    check: TokenCheck | None = request.app.state.token_check
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            status_code=401,
            detail="missing bearer token: send Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = None if check is None else check(credentials.credentials)
    if principal is None:
        raise HTTPException(
            status_code=401,
            detail="invalid token (unknown, revoked or expired)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.principal = principal
    return principal


PrincipalDep = Annotated[Principal, Depends(_principal)]

Reads = Literal["open", "tenant"]
READS: tuple[Reads, ...] = get_args(Reads)


def _reader(request: Request) -> Principal | None:
    """Who reads: with ``reads=open`` (the default) anyone, and no token is looked at
    (``None``); with ``reads=tenant`` the holder of a valid token (401 without one). The
    header is read here rather than through the bearer scheme, so the schema does not
    declare reads authenticated when they are open."""
    if request.app.state.reads == "open":
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    credentials = (
        HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip())
        if scheme and token.strip()
        else None
    )
    return _principal(request, credentials)


ReaderDep = Annotated[Principal | None, Depends(_reader)]
"""Who reads a job-scoped listing or item (``seen_tenant`` says whose jobs)."""


def seen_tenant(reader: Principal | None) -> str | None:
    """The one tenant whose jobs ``reader`` sees; ``None``: every tenant's (open reads,
    or an admin's token)."""
    return None if reader is None or reader.is_admin else reader.tenant


def every_tenant(reader: Principal | None) -> None:
    """403 unless ``reader`` may see every tenant's jobs at once (the dashboard,
    ``/metrics``): open reads, or an admin's token."""
    if seen_tenant(reader) is not None:
        assert reader is not None
        raise HTTPException(
            status_code=403,
            detail="reads are per tenant (reads=tenant): this view shows every tenant's "
            f"jobs and needs an admin's token; a {reader.role}'s reads /jobs, "
            "/decisions and /overrides",
        )


def _writer(principal: PrincipalDep) -> Principal:
    """A token that may change things: an admin's or a member's (403 for a viewer's)."""
    if not principal.writes:
        raise HTTPException(
            status_code=403, detail=f"a {principal.role}'s token reads only; it changes nothing"
        )
    return principal


def _admin(principal: PrincipalDep) -> Principal:
    """An admin's token (403 for any other)."""
    if not principal.is_admin:
        raise HTTPException(
            status_code=403,
            detail=f"only an admin's token may do this (this one is a {principal.role}'s "
            f"of tenant {principal.tenant!r})",
        )
    return principal


def acting_for(principal: Principal, tenant: str, what: str) -> None:
    """403 unless ``principal`` may change ``tenant``'s jobs (``what``: the job, for the
    message)."""
    if not principal.may_act_for(tenant):
        raise HTTPException(
            status_code=403,
            detail=f"{what} belongs to tenant {tenant!r}; this token is a {principal.role}'s "
            f"of tenant {principal.tenant!r}",
        )


# scope="function": the transaction commits before the response is sent, so a client
# that got 201 reads its own write on the next request (FastAPI's default scope ends the
# dependency after the response).
SessionDep = Annotated[Session, Depends(_session, scope="function")]
TelemetryDep = Annotated[str, Depends(_telemetry)]
TokenDep = Depends(_writer)
"""For ``dependencies=[...]`` of a mutation that any admin or member may make."""
WriterDep = Annotated[Principal, Depends(_writer)]
"""The principal of a mutation that any admin or member may make (which then checks the
tenant: ``acting_for``)."""
AdminTokenDep = Depends(_admin)
"""For ``dependencies=[...]`` of a mutation only an admin may make."""
AdminDep = Annotated[Principal, Depends(_admin)]
"""The principal of a mutation only an admin may make."""
