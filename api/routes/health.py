from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from autotune import __version__
from autotune.api.schemas import Health, LeaderPublic, Readiness, TickHealthPublic
from autotune.daemon.health import TickHealth
from autotune.daemon.leader import LeaderStatus
from autotune.db import Database
from autotune.db import repository as repo

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The daemon is alive."""
    return Health(version=__version__)


def _tick_public(health: TickHealth) -> TickHealthPublic:
    return TickHealthPublic(
        ok=health.ok,
        consecutive_failures=health.consecutive_failures,
        failures_total=health.failures_total,
        last_error=health.last_error,
        last_failure_at=health.last_failure_at,
        fallback=health.fallback is not None,
        fallback_policy=health.fallback,
        paused=health.paused,
        paused_since=health.paused_since,
    )


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the database answers, a policy is loaded, and, on the daemon that
    decides, its last tick succeeded with its own policy (503 otherwise, with the
    reasons). A daemon that follows another's lead serves the API: it is ready when the
    database answers; ``leader`` says which daemon decides."""
    database: Database = request.app.state.db
    version = None
    reachable = False
    reasons: list[str] = []
    try:
        with database.session() as session:
            version = repo.active_policy_version(session=session)
        reachable = True
    except Exception as exc:  # any driver error means: not ready
        reachable = False
        reasons.append(f"database unreachable: {type(exc).__name__}")
    if reachable and version is None:
        reasons.append("no active policy version")
    tick = None
    leader = None
    leader_status: Callable[[], LeaderStatus] | None = request.app.state.metrics.leader_status
    if leader_status is not None:
        status = leader_status()
        leader = LeaderPublic(**asdict(status))
    tick_health: Callable[[], TickHealth] | None = getattr(request.app.state, "tick_health", None)
    if tick_health is not None:
        health = tick_health()
        tick = _tick_public(health)
        deciding = leader is None or leader.term is not None
        if deciding and (why := health.describe()) is not None:
            reasons.append(why)
    ready = not reasons
    body = Readiness(
        status="ready" if ready else "not ready",
        database=reachable,
        policy_version=version,
        tick=tick,
        leader=leader,
        reasons=reasons,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ready else 503)
