from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from autotune.api.deps import SessionDep
from autotune.api.schemas import ForecastPoint, ForecastPublic
from autotune.daemon.forecast import forecast_series
from autotune.db import repository as repo
from autotune.interfaces import LoadForecaster

router = APIRouter(prefix="/forecast", tags=["forecast"])

METRIC = "gpu_utilization"


@router.get("", response_model=ForecastPublic)
def get_forecast(
    session: SessionDep,
    request: Request,
    samples: Annotated[int, Query(ge=2, le=5000)] = 300,
    horizon: Annotated[int, Query(ge=1, le=1000)] = 1,
) -> ForecastPublic:
    """Cluster GPU utilisation: the newest ``samples`` ticks as measured, each next to
    what the forecaster predicted for it ``horizon`` ticks before, and the prediction
    for the next ``horizon`` ticks."""
    forecaster: LoadForecaster = request.app.state.forecaster
    history = repo.list_metrics(session=session, names=[METRIC], limit=samples)
    values = [s.value for s in history]
    series = forecast_series(values, forecaster, horizon=horizon)
    return ForecastPublic(
        metric=METRIC,
        predictor=forecaster.name,
        horizon_ticks=horizon,
        current_prediction=series.current,
        actual=[ForecastPoint(at=s.recorded_at, value=s.value) for s in history],
        predicted=[ForecastPoint(at=history[i].recorded_at, value=v) for i, v in series.predicted],
        mean_absolute_error=series.mean_absolute_error,
    )
