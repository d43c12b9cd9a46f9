from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from autotune import __version__
from autotune.api.schemas import Health, Readiness
from autotune.db import Database
from autotune.db import repository as repo

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The daemon is alive."""
    return Health(version=__version__)


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the database answers and a policy is loaded (503 otherwise)."""
    database: Database = request.app.state.db
    version = None
    reachable = False
    try:
        with database.session() as session:
            version = repo.active_policy_version(session=session)
        reachable = True
    except Exception:  # any driver error means: not ready
        reachable = False
    ready = reachable and version is not None
    body = Readiness(
        status="ready" if ready else "not ready", database=reachable, policy_version=version
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
