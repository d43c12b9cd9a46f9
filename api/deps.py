"""Dependencies and errors shared by the routers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TypeVar

import anyio
from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from autotune.daemon.auth import TokenCheck
from autotune.db import Database
from autotune.db.repository import CursorError

__all__ = [
    "MAX_OFFSET",
    "CursorQuery",
    "IdPath",
    "OffsetQuery",
    "SessionDep",
    "TelemetryDep",
    "TokenDep",
    "bad_cursor",
    "in_session",
    "unprocessable",
]

T = TypeVar("T")


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 in FastAPI's own validation shape for the request body's ``field`` (dotted
    for a nested one: ``constraints.gpu_milli``)."""
    return HTTPException(
        status_code=422,
        detail=[{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}],
    )


MAX_OFFSET = 10_000
"""Deepest ``offset`` a listing takes; deeper pages go by ``cursor``."""
_MAX_ID = 2**63 - 1

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
        description="The previous page's next: the page right after it",
    ),
]
IdPath = Annotated[int, Path(ge=1, le=_MAX_ID)]


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


_bearer = HTTPBearer(auto_error=False, description="The daemon's API token")


def _token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Mutations need ``Authorization: Bearer <token>``; the token is never logged."""
    check: TokenCheck | None = request.app.state.token_check
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            status_code=401,
            detail="missing bearer token: send Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if check is None or not check(credentials.credentials):
        raise HTTPException(
            status_code=401, detail="invalid token", headers={"WWW-Authenticate": "Bearer"}
        )


# scope="function": the transaction commits before the response is sent, so a client
# that got 201 reads its own write on the next request (FastAPI's default scope ends the
# dependency after the response).
SessionDep = Annotated[Session, Depends(_session, scope="function")]
TelemetryDep = Annotated[str, Depends(_telemetry)]
TokenDep = Depends(_token)
