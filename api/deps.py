"""Dependencies shared by the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from autotune.db import Database

__all__ = ["SessionDep", "TelemetryDep"]


def _session(request: Request) -> Iterator[Session]:
    database: Database = request.app.state.db
    with database.session() as session:
        yield session


def _telemetry(request: Request) -> str:
    telemetry: str = request.app.state.telemetry
    return telemetry


SessionDep = Annotated[Session, Depends(_session)]
TelemetryDep = Annotated[str, Depends(_telemetry)]
