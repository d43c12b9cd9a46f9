"""Dependencies and errors shared by the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from autotune.daemon.auth import TokenCheck
from autotune.db import Database

__all__ = ["SessionDep", "TelemetryDep", "TokenDep", "unprocessable"]


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 in FastAPI's own validation shape for the request body's ``field`` (dotted
    for a nested one: ``constraints.gpu_milli``)."""
    return HTTPException(
        status_code=422,
        detail=[{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}],
    )


def _session(request: Request) -> Iterator[Session]:
    database: Database = request.app.state.db
    with database.session() as session:
        yield session


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
