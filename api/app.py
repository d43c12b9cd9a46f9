"""The FastAPI application: ``create_app`` wires the routers to a database."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from autotune import __version__
from autotune.api.cache import CachedReads, JobCounts, TickCache
from autotune.api.deps import READS, ReaderDep, Reads, every_tenant
from autotune.api.metrics import ServiceMetrics
from autotune.api.middleware import AuditLog, BodyLimitAndTiming
from autotune.api.routes import audit as audit_log
from autotune.api.routes import (
    cluster,
    dashboard,
    decisions,
    forecast,
    health,
    jobs,
    overrides,
    policies,
    tenants,
    tokens,
)
from autotune.daemon.auth import TokenCheck
from autotune.daemon.lifecycle import PolicyLifecycle, PolicyLoader
from autotune.daemon.telemetry import TelemetrySource
from autotune.daemon.tick import Daemon
from autotune.db import Database, database_error
from autotune.demand import DemandForecaster

__all__ = ["API_PREFIX", "attach_daemon", "create_app"]

API_PREFIX = "/api/v1"


def _where(loc: Sequence[object]) -> str:
    return ".".join(str(part) for part in loc)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """422 in FastAPI's shape, plus one line naming the first field that is wrong."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    return JSONResponse(
        status_code=422,
        content={
            "message": f"{_where(first['loc'])}: {first['msg']}",
            "detail": jsonable_encoder(errors, exclude={"ctx", "input", "url"}),
        },
    )


RETRY_AFTER_S = 1


async def _database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    """503 with ``Retry-After`` when the database cannot serve the request now: no
    connection free within the pool timeout, the database locked or unreachable."""
    if isinstance(exc, PoolTimeout):
        why = "no database connection free in time (the API is at capacity)"
    elif isinstance(exc, DBAPIError) and exc.connection_invalidated:
        why = "the database connection was lost"
    else:
        why = f"the database cannot answer now ({database_error(exc)})"
    return JSONResponse(
        status_code=503,
        content={"detail": f"{why}; retry in {RETRY_AFTER_S} s"},
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def create_app(
    *,
    db: Database,
    telemetry: str,
    token_check: TokenCheck | None = None,
    reads: Reads = "open",
    task_modules: Sequence[str] = (),
    trains: bool = False,
    max_body_bytes: int = 65_536,
    host_telemetry: Sequence[TelemetrySource] = (),
    forecasters: Sequence[DemandForecaster] = (),
    metrics: ServiceMetrics | None = None,
    policy_loader: PolicyLoader | None = None,
) -> FastAPI:
    """The API over ``db``; ``telemetry`` names where cluster figures come from.

    Mutations need a bearer token that ``token_check`` accepts (none without one), whose
    role and tenant allow them (``autotune.daemon.auth``); each is in the audit log.
    ``reads``: ``open`` (anyone reads) or ``tenant`` (reads need a token; a member or a
    viewer sees its own tenant's jobs only, the dashboard and ``/metrics`` an admin).
    ``trains``: the daemon's backend trains jobs for real (``--backend ray``), so jobs
    whose built-in task is simulated only are refused at submission. ``policy_loader``
    checks checkpoints registered through ``POST /policies`` (default: the one of the
    daemon's policy lifecycle, once attached). ``forecasters``: the demand forecaster
    chain behind ``/forecast`` and the dashboard, first choice first (the command line
    assembles it: the LSTM, then its persistence fallback); ``NoForecast`` answers when
    none works, or alone when the chain is empty."""
    app = FastAPI(
        title="autotune",
        version=__version__,
        description="Decisions of the autotune daemon: jobs, placements, configurations, "
        "overrides, tenants and their tokens. Mutations need Authorization: Bearer <token>, "
        "of a role and tenant that may make them.",
    )
    app.state.db = db
    app.state.telemetry = telemetry
    app.state.token_check = token_check
    if reads not in READS:
        raise ValueError(f"reads={reads!r}: one of {', '.join(READS)}")
    app.state.reads = reads
    app.state.task_modules = tuple(task_modules)
    app.state.trains = trains
    app.state.host_telemetry = tuple(host_telemetry)
    app.state.forecasters = tuple(forecasters)
    app.state.tick_health = None  # set by attach_daemon
    app.state.policy_loader = policy_loader
    # Whether the daemon in this process follows the policy registry (None: no daemon
    # here; only the registry changes).
    app.state.policy_lifecycle = None
    app.state.job_counts = job_counts = JobCounts()
    app.state.metrics = metrics = metrics or ServiceMetrics(db, job_counts)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(PoolTimeout, _database_unavailable)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
    app.state.tick_cache = None  # set by attach_daemon
    app.add_middleware(CachedReads)
    app.add_middleware(AuditLog, db=db, prefix=API_PREFIX)
    # Added last, so outermost: cached answers are timed too.
    app.add_middleware(BodyLimitAndTiming, max_body_bytes=max_body_bytes, metrics=metrics)
    v1 = APIRouter(prefix=API_PREFIX)
    for module in (
        health,
        cluster,
        jobs,
        decisions,
        overrides,
        policies,
        tenants,
        tokens,
        audit_log,
        forecast,
    ):
        v1.include_router(module.router)
    v1.include_router(tokens.whoami_router)

    @v1.get("/metrics", tags=["health"], response_class=Response)
    @app.get("/metrics", tags=["health"], response_class=Response)
    def prometheus_metrics(reader: ReaderDep) -> Response:
        """Prometheus text format: decisions per source, tick duration, API latency,
        job goodput, jobs per state. With ``reads=tenant``, an admin's token only (it
        names every tenant's jobs)."""
        every_tenant(reader)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(v1)
    app.include_router(health.router)  # /healthz and /readyz at the root too, for probes
    app.include_router(dashboard.router)
    return app


def attach_daemon(app: FastAPI, daemon: Daemon) -> None:
    """Let the app report ``daemon``'s decision loop, which runs in the same process:
    tick durations, failed ticks and the fallback in ``/metrics``, and its health in
    ``/readyz``; and keep the busiest reads from one tick to the next
    (``autotune.api.cache``)."""
    app.state.tick_health = lambda: daemon.health
    metrics: ServiceMetrics = app.state.metrics
    metrics.tick_health = app.state.tick_health
    metrics.job_metrics_every_s = daemon.job_samples.every_s
    if daemon.leadership is not None:
        metrics.leader_status = daemon.leadership.status
    daemon.add_tick_observer(metrics.observe_tick)
    # What the busiest reads return changes once per tick: keep it until the next one;
    # only while this daemon decides (a follower does not know when the leader ticks).
    leadership = daemon.leadership
    cache = app.state.tick_cache = TickCache(
        serving=None if leadership is None else (lambda: daemon.term is not None)
    )
    daemon.add_after_tick(cache.clear)
    # Registry changes are refused when the daemon would never act on them.
    lifecycle = daemon.lifecycle
    app.state.policy_lifecycle = lifecycle is not None
    if app.state.policy_loader is None and isinstance(lifecycle, PolicyLifecycle):
        app.state.policy_loader = lifecycle.loader
