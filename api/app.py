"""The FastAPI application: ``create_app`` wires the routers to a database."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from autotune import __version__
from autotune.api.routes import cluster, decisions, health, jobs
from autotune.db import Database

__all__ = ["API_PREFIX", "create_app"]

API_PREFIX = "/api/v1"


def create_app(*, db: Database, telemetry: str) -> FastAPI:
    """The API over ``db``; ``telemetry`` names where cluster figures come from."""
    app = FastAPI(
        title="autotune",
        version=__version__,
        description="Decisions of the autotune daemon: jobs, placements, configurations.",
    )
    app.state.db = db
    app.state.telemetry = telemetry
    v1 = APIRouter(prefix=API_PREFIX)
    for module in (health, cluster, jobs, decisions):
        v1.include_router(module.router)
    app.include_router(v1)
    return app
