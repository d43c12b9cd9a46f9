"""Demand forecasts in the daemon: the forecaster chain (the LSTM first, its named
persistence fallback next) and the replay of it over the demand the daemon recorded.

Every tick the daemon stores ``gpu_demand`` (GPUs held plus GPUs pending jobs ask for)
and ``gpu_capacity`` (the cluster's GPUs, parked nodes included). ``forecast_window``
puts those samples on real minutes (``autotune.demand.DemandHistory``) and asks the
first forecaster of the chain that works for a forecast made at every minute, from that
minute and the ones before only; ``GET /api/v1/forecast`` and the dashboard show them.
The forecasters themselves are chosen by the command line (``autotune daemon
--forecast``): the API knows them only through ``autotune.demand.DemandForecaster``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from autotune.demand import (
    HORIZONS,
    QUANTILES,
    DemandForecaster,
    DemandHistory,
    NoForecast,
    series_forecasts,
    targets,
)

__all__ = ["CAPACITY_METRIC", "DEMAND_METRIC", "ForecastWindow", "forecast_window"]

DEMAND_METRIC = "gpu_demand"
CAPACITY_METRIC = "gpu_capacity"


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastWindow:
    predictor: str
    """The forecaster that made the forecasts (the first of the chain that worked)."""
    failures: list[str] = field(default_factory=list)
    """Why the forecasters before it did not (empty when the first one worked)."""
    minutes: list[datetime] = field(default_factory=list)
    """Each minute of the window (the newest sample's time within that minute)."""
    demand: list[float] = field(default_factory=list)
    """GPU demand at each minute."""
    capacity: float = 0.0
    p_arrival: dict[int, list[float]] = field(default_factory=dict)
    """Per horizon, the probability made at each minute that new demand arrives within
    the horizon."""
    quantiles: dict[int, list[tuple[float, ...]]] = field(default_factory=dict)
    """Per horizon, the peak-demand quantiles (``QUANTILES``) made at each minute."""

    def realised(self, horizon: int) -> list[tuple[bool, float] | None]:
        """What happened after each minute within ``horizon`` minutes: (arrival, peak), or
        ``None`` where the window has not passed yet."""
        passed = max(0, len(self.demand) - horizon)
        if not passed:
            return [None] * len(self.demand)
        arrival, peak = targets(
            np.asarray(self.demand, dtype=np.float64), np.arange(passed, dtype=np.int64), horizon
        )
        done = [(bool(a), float(p)) for a, p in zip(arrival, peak, strict=True)]
        return [*done, *[None] * (len(self.demand) - passed)]

    def coverage(self, horizon: int, level: float = 0.95) -> float | None:
        """Share of the minutes whose peak over the horizon stayed at or under the
        ``level`` quantile forecast for it (``None`` before any window has passed)."""
        j = QUANTILES.index(level)
        hits = [
            peak <= q[j]
            for r, q in zip(self.realised(horizon), self.quantiles[horizon], strict=True)
            if r is not None
            for peak in (r[1],)
        ]
        return sum(hits) / len(hits) if hits else None


def forecast_window(
    demand: Sequence[tuple[datetime, float]],
    capacity: Sequence[tuple[datetime, float]],
    forecasters: Sequence[DemandForecaster],
) -> ForecastWindow:
    """Forecasts over the recorded samples ``demand`` (time, GPUs; oldest first), each
    made from the minutes up to it. The first forecaster in ``forecasters`` that works
    makes them; ``NoForecast`` is the last resort."""
    history = DemandHistory(keep_minutes=10**9)
    stamps: dict[int, datetime] = {}
    for at, value in demand:
        history.record(at.timestamp(), value)
        stamps[math.floor(at.timestamp() / 60)] = at
    cap = max((v for _, v in capacity), default=0.0)
    if not len(history):
        return ForecastWindow(predictor=forecasters[0].name if forecasters else "none")
    values = history.minutes_recorded()
    first = history.first_minute
    assert first is not None
    minutes = []
    last_seen = demand[0][0]
    for i in range(len(values)):
        last_seen = stamps.get(first + i, last_seen)
        minutes.append(last_seen)
    cap = cap or float(max(values)) or 1.0
    failures: list[str] = []
    for forecaster in [*forecasters, NoForecast()]:
        try:
            prob, peak = series_forecasts(forecaster, values, first, cap)
        except Exception as exc:  # a broken forecaster must not break the API
            failures.append(f"{forecaster.name}: {type(exc).__name__}: {exc}")
            continue
        if not (np.isfinite(prob).all() and np.isfinite(peak).all()):
            failures.append(f"{forecaster.name}: not a finite forecast")
            continue
        return ForecastWindow(
            predictor=forecaster.name,
            failures=failures,
            minutes=minutes,
            demand=[float(v) for v in values],
            capacity=cap,
            p_arrival={h: [float(p) for p in prob[:, i]] for i, h in enumerate(HORIZONS)},
            quantiles={
                h: [tuple(float(x) for x in row) for row in peak[:, i]]
                for i, h in enumerate(HORIZONS)
            },
        )
    raise AssertionError("NoForecast cannot fail")  # pragma: no cover
