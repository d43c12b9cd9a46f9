from __future__ import annotations

from fastapi import APIRouter

from autotune import __version__
from autotune.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The daemon is alive."""
    return Health(version=__version__)
