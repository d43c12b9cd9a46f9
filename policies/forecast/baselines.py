"""The baselines the LSTM is scored against, fitted on the same training and validation
data and stored with the checkpoint (``Baselines``): *calibrated persistence*
(P(arrival | an arrival in the last h minutes or not)), *climatology* (the arrival rate at
that hour of the day; the peak quantiles of the last week's demand) and *persistence +
buffer* (demand now plus a fixed share of the cluster's GPUs per quantile, chosen on the
validation days: the Helios CES rule). ``Persistence`` is the forecaster's named fallback
made of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from autotune.demand import DAY_MINUTES, HORIZONS, QUANTILES, WEEK_MINUTES, rises
from autotune.policies.forecast.features import F64, I64, rolling_sum

__all__ = ["Baselines", "Persistence", "climatology", "fit_baselines"]


@dataclass(frozen=True, slots=True)
class Baselines:
    """The baselines' parameters, fitted on training data (``fit_baselines``)."""

    persistence: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Per horizon: P(arrival | none in the last h minutes), P(arrival | one)."""
    hourly: dict[int, list[float]] = field(default_factory=dict)
    """Per horizon: the arrival rate at each hour of the day (climatology)."""
    buffer: dict[int, list[float]] = field(default_factory=dict)
    """Per horizon: per quantile, the share of the cluster's GPUs added to demand now."""

    def to_json(self) -> dict[str, Any]:
        return {k: {str(h): v for h, v in getattr(self, k).items()} for k in asdict(self)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Baselines:
        return Baselines(
            persistence={
                int(h): (float(v[0]), float(v[1])) for h, v in data["persistence"].items()
            },
            hourly={int(h): [float(x) for x in v] for h, v in data["hourly"].items()},
            buffer={int(h): [float(x) for x in v] for h, v in data["buffer"].items()},
        )


def fit_baselines(
    horizons: Sequence[int],
    quantiles: Sequence[float],
    *,
    arrival: F64,
    recent: F64,
    hour: I64,
    valid_excess: F64,
) -> Baselines:
    """The baselines fitted on training rows (``arrival``, ``recent``: (n, horizons), an
    arrival in the next and in the last h minutes; ``hour``: (n,), the hour of the day),
    the buffers chosen on the validation rows' peak excess (``valid_excess``: (n,
    horizons), share of the cluster's GPUs)."""
    persistence: dict[int, tuple[float, float]] = {}
    hourly: dict[int, list[float]] = {}
    buffer: dict[int, list[float]] = {}
    for i, h in enumerate(horizons):
        a, r = arrival[:, i], recent[:, i]
        persistence[h] = (float(a[r == 0].mean()), float(a[r == 1].mean()))
        rate = np.bincount(hour, weights=a, minlength=24) / np.maximum(
            np.bincount(hour, minlength=24), 1
        )
        hourly[h] = [float(x) for x in rate]
        buffer[h] = [float(np.quantile(valid_excess[:, i], q)) for q in quantiles]
    return Baselines(persistence=persistence, hourly=hourly, buffer=buffer)


class Persistence:
    """The named fallback forecaster: calibrated persistence for the arrival
    probability, persistence + buffer for the peak quantiles (``Baselines``)."""

    name: str = "persistence + buffer"

    def __init__(self, baselines: Baselines, horizons: Sequence[int] = HORIZONS) -> None:
        self.baselines = baselines
        self.horizons = tuple(horizons)
        self.history = max(self.horizons) + 1

    def predict(
        self, demand: F64, capacity: float, ends: I64, week_minute: F64, origin: int = 0
    ) -> tuple[F64, F64]:
        del week_minute, origin
        prob = np.empty((len(ends), len(self.horizons)))
        peak = np.empty((len(ends), len(self.horizons), len(QUANTILES)))
        cum = np.concatenate([[0], np.cumsum(rises(demand))])
        for i, h in enumerate(self.horizons):
            recent = rolling_sum(cum.astype(np.float64), ends, h) > 0
            p0, p1 = self.baselines.persistence[h]
            prob[:, i] = np.where(recent, p1, p0)
            peak[:, i] = demand[ends][:, None] + np.asarray(self.baselines.buffer[h]) * capacity
        return prob, peak


def climatology(
    baselines: Baselines, demand: F64, ends: I64, week_minute: F64, horizons: Sequence[int]
) -> tuple[F64, F64]:
    """Arrival rate at the hour of the day; peak quantiles of the last week's demand (up to
    and including each end)."""
    hour = ((week_minute % DAY_MINUTES) // 60).astype(np.int64)
    prob = np.column_stack([np.asarray(baselines.hourly[h])[hour] for h in horizons])
    series = pd.Series(demand)
    levels = [series.rolling(WEEK_MINUTES, min_periods=1).quantile(q).to_numpy() for q in QUANTILES]
    week = np.stack([lv[ends] for lv in levels], axis=1)
    peak = np.repeat(week[:, None, :], len(horizons), axis=1)
    return prob, peak
