"""``GET /forecast``: the cluster's GPU demand per minute next to the demand forecasts made
at each minute (``autotune.daemon.forecast.forecast_window``), and how well those whose
horizon has passed did. The dashboard's "GPU demand" panel reads the same window."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from sqlalchemy.orm import Session

from autotune.api.deps import SessionDep
from autotune.api.schemas import ArrivalCheck, DemandPoint, ForecastPublic, HorizonForecast
from autotune.daemon.forecast import (
    CAPACITY_METRIC,
    DEMAND_METRIC,
    ForecastWindow,
    forecast_window,
)
from autotune.db import repository as repo
from autotune.demand import HORIZONS, QUANTILES, DemandForecaster

__all__ = ["DemandWindow", "read_demand_window", "router"]

router = APIRouter(prefix="/forecast", tags=["forecast"])

MAX_MINUTES = 10_080  # a week
SAMPLES_CAP = 50_000
"""Samples of each metric one request reads by default: 6 hours of 2 s ticks and more."""


@dataclass(frozen=True, slots=True)
class DemandWindow:
    window: ForecastWindow
    at: list[datetime]
    """Start of each minute of the window (UTC)."""
    truncated: bool
    """The samples cap cut the window short."""

    def passed(self, horizon: int) -> list[tuple[int, bool, float]]:
        """(minute index, arrival, peak) of each forecast whose horizon has passed."""
        return [
            (i, r[0], r[1]) for i, r in enumerate(self.window.realised(horizon)) if r is not None
        ]

    def horizon_forecast(self, i: int, horizon: int) -> HorizonForecast:
        q = self.window.quantiles[horizon][i]
        return HorizonForecast(
            p_arrival=self.window.p_arrival[horizon][i],
            q50=q[QUANTILES.index(0.5)],
            q90=q[QUANTILES.index(0.9)],
            q95=q[QUANTILES.index(0.95)],
        )

    def arrivals(self, horizon: int) -> ArrivalCheck:
        passed = self.passed(horizon)
        if not passed:
            return ArrivalCheck(windows=0, observed_rate=None, mean_p_arrival=None)
        p = self.window.p_arrival[horizon]
        return ArrivalCheck(
            windows=len(passed),
            observed_rate=sum(arrived for _, arrived, _ in passed) / len(passed),
            mean_p_arrival=sum(p[i] for i, _, _ in passed) / len(passed),
        )


def read_demand_window(
    session: Session,
    forecasters: tuple[DemandForecaster, ...],
    *,
    minutes: int,
    samples: int = SAMPLES_CAP,
) -> DemandWindow:
    """The forecasts over the newest ``minutes`` minutes of recorded demand (those up to
    the newest sample's minute; at most the newest ``samples`` samples of each metric)."""
    newest = repo.list_metrics(session=session, names=[DEMAND_METRIC], limit=1)
    if not newest:
        return DemandWindow(forecast_window([], [], forecasters), [], truncated=False)
    last = math.floor(newest[-1].recorded_at.timestamp() / 60)
    since = datetime.fromtimestamp((last - minutes + 1) * 60, UTC)
    # One sample more than the cap says whether the cap cut the window short.
    demand = repo.list_metrics(
        session=session, names=[DEMAND_METRIC], since=since, limit=samples + 1
    )
    truncated = len(demand) > samples
    demand = demand[-samples:]
    capacity = repo.list_metrics(
        session=session, names=[CAPACITY_METRIC], since=since, limit=samples
    )
    window = forecast_window(
        [(s.recorded_at, s.value) for s in demand],
        [(s.recorded_at, s.value) for s in capacity],
        forecasters,
    )
    first = math.floor(demand[0].recorded_at.timestamp() / 60)
    at = [datetime.fromtimestamp((first + i) * 60, UTC) for i in range(len(window.demand))]
    return DemandWindow(window, at, truncated)


@router.get("", response_model=ForecastPublic)
def get_forecast(
    session: SessionDep,
    request: Request,
    minutes: Annotated[
        int, Query(ge=1, le=MAX_MINUTES, description="Minutes of history shown")
    ] = 360,
    samples: Annotated[
        int,
        Query(
            ge=2,
            le=500_000,
            description="Samples of each metric read at most (one per tick): the newest "
            "ones, when the minutes hold more",
        ),
    ] = SAMPLES_CAP,
) -> ForecastPublic:
    """The cluster's GPU demand (GPUs held plus GPUs pending jobs ask for) per minute over
    the newest ``minutes`` minutes, each minute next to the forecast made at it from it and
    the minutes before only: per horizon (15 and 60 minutes) the probability that new
    demand arrives and the quantiles of the peak demand, in GPUs. ``now`` is the forecast
    made at the newest minute. For the forecasts whose horizon has passed within the
    window: ``coverage95``, the share whose peak stayed at or under their 95% quantile,
    and ``arrivals``, how often demand arrived next to the mean probability forecast.
    ``predictor`` names the forecaster of the daemon's chain (``autotune daemon
    --forecast``) that made them, ``fallback_reasons`` why the ones before it did not."""
    forecasters: tuple[DemandForecaster, ...] = request.app.state.forecasters
    data = read_demand_window(session, forecasters, minutes=minutes, samples=samples)
    window = data.window
    n = len(window.demand)
    return ForecastPublic(
        predictor=window.predictor,
        fallback_reasons=window.failures,
        minutes=minutes,
        truncated=data.truncated,
        capacity_gpus=window.capacity,
        now={h: data.horizon_forecast(n - 1, h) for h in HORIZONS} if n else None,
        points=[
            DemandPoint(
                at=data.at[i],
                demand_gpus=window.demand[i],
                forecast={h: data.horizon_forecast(i, h) for h in HORIZONS},
            )
            for i in range(n)
        ],
        coverage95={h: window.coverage(h, 0.95) if n else None for h in HORIZONS},
        arrivals={h: data.arrivals(h) for h in HORIZONS},
    )
