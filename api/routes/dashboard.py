"""The dashboard at ``/``: the cluster's GPU demand next to its capacity and the demand
forecast (the 15-minute peak band, aligned at the end of the window it forecasts, and the
arrival probabilities), goodput per job, a timeline of decisions by source (a shadow
policy's too), and, when a shadow policy ran, its agreement with the active one and both
rounds' predicted goodput. Plotly's
JavaScript is served from the installed ``plotly`` package, so the page needs no network
beyond the daemon."""

from __future__ import annotations

from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from sqlalchemy.orm import Session

from autotune.api.deps import SessionDep
from autotune.api.routes.forecast import MAX_MINUTES, read_demand_window
from autotune.daemon.lifecycle import SHADOW_METRICS
from autotune.db import repository as repo
from autotune.demand import HORIZONS, QUANTILES, DemandForecaster

router = APIRouter(tags=["dashboard"])

_PAGE = (Path(__file__).parent.parent / "static" / "dashboard.html").read_text()


def _plotly_js() -> Path:
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise HTTPException(status_code=404, detail="plotly.min.js not found in the plotly package")
    return path


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard_page() -> HTMLResponse:
    return HTMLResponse(_PAGE)


@router.get("/static/plotly.min.js", include_in_schema=False)
def plotly_js() -> FileResponse:
    return FileResponse(
        _plotly_js(),
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.get("/api/v1/dashboard", tags=["dashboard"])
def dashboard_data(
    session: SessionDep,
    request: Request,
    samples: Annotated[int, Query(ge=2, le=5000)] = 300,
    minutes: Annotated[
        int, Query(ge=1, le=MAX_MINUTES, description="Minutes of GPU demand shown")
    ] = 180,
) -> dict[str, Any]:
    """The dashboard's figures in one response: ``demand`` over the newest ``minutes``
    minutes, the rest over the newest ``samples`` ticks."""
    forecasters: tuple[DemandForecaster, ...] = request.app.state.forecasters
    # One sample more than shown: a tick's decisions are committed just before its
    # sample, so the window's decisions are those after the sample before it.
    ticks = repo.list_metrics(session=session, names=["gpu_utilization"], limit=samples + 1)
    since = ticks[0].recorded_at if len(ticks) > samples else None
    rows = repo.list_decision_rows(session=session, since=since, limit=500).rows
    # A shadow policy's decisions have a page of their own: they never crowd out the
    # decisions taken.
    shadow_rows = repo.list_decision_rows(
        session=session, source="shadow", since=since, limit=500
    ).rows
    rows = sorted([*rows, *shadow_rows], key=lambda row: int(row["id"]), reverse=True)
    demand = _demand(session, forecasters, minutes)
    return {
        "predictor": demand["predictor"],
        "demand": demand,
        "goodput": _per_job(session, "job_goodput", since),
        # Measured on each step where jobs train for real (--backend ray); tokens/s where
        # the task says its sequence length.
        "throughput": {
            unit: _per_job(session, f"job_{unit}", since)
            for unit in ("samples_per_s", "tokens_per_s")
        },
        "decisions": [
            {
                "id": row["id"],
                "at": row["decided_at"].isoformat(),
                "job_id": row["job_id"],
                "source": row["source"],
                "override_id": row["override_id"],
                "reason": row["reason"][:200],
            }
            for row in reversed(rows)
        ],
        "jobs": request.app.state.job_counts.read(session),
        "shadow": _shadow(session, since, samples),
    }


def _demand(
    session: Session, forecasters: tuple[DemandForecaster, ...], minutes: int
) -> dict[str, Any]:
    """GPU demand per minute (GPUs), the cluster's capacity, the band of the 15-minute
    peak forecast and the arrival probabilities. A band point at minute t is the forecast
    made at t - 15 for the peak over (t - 15, t], so the demand at t stays under its q95
    when the forecast covers; its last 15 points are the forecast ahead of now. The
    arrival probabilities are shown at the minute they were made."""
    data = read_demand_window(session, forecasters, minutes=minutes)
    window = data.window
    horizon = HORIZONS[0]
    quantiles = window.quantiles.get(horizon, [])
    return {
        "predictor": window.predictor,
        "fallback_reasons": window.failures,
        "capacity_gpus": window.capacity,
        "at": [t.isoformat() for t in data.at],
        "demand_gpus": window.demand,
        "band": {
            "horizon_min": horizon,
            "at": [(t + timedelta(minutes=horizon)).isoformat() for t in data.at],
            **{
                f"q{round(100 * level)}": [q[j] for q in quantiles]
                for j, level in enumerate(QUANTILES)
            },
        },
        "p_arrival": {str(h): window.p_arrival.get(h, []) for h in HORIZONS},
        "coverage95": {
            str(h): window.coverage(h, 0.95) if window.demand else None for h in HORIZONS
        },
    }


def _shadow(session: Session, since: datetime | None, samples: int) -> dict[str, Any]:
    """Per shadowed tick in the window: the agreement with the active policy and both
    rounds' predicted goodput (empty lists when no shadow ran), and the shadow now."""
    _active, shadow = repo.policy_state(session=session)
    series: dict[str, Any] = {"version": shadow.version if shadow is not None else None}
    for key, name in zip(
        ("agreement", "shadow_goodput", "active_goodput"), SHADOW_METRICS, strict=True
    ):
        points = repo.list_metrics(session=session, names=[name], since=since, limit=samples)
        series[key] = {
            "at": [p.recorded_at.isoformat() for p in points],
            "value": [p.value for p in points],
        }
    return series


def _per_job(
    session: Session, name: str, since: datetime | None
) -> dict[str, dict[str, list[Any]]]:
    """One line per job of the metric ``name``: ``{"at": [...], "value": [...]}``."""
    lines: dict[str, dict[str, list[Any]]] = {}
    for sample in repo.list_metrics(session=session, names=[name], since=since, limit=20_000):
        if sample.job_id is None:
            continue
        line = lines.setdefault(sample.job_id, {"at": [], "value": []})
        line["at"].append(sample.recorded_at.isoformat())
        line["value"].append(sample.value)
    return lines
