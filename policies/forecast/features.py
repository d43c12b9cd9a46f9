"""The forecaster's input: a cluster's GPU demand per minute (``read_demand``) and what a
forecast made at a minute reads of it, that minute and the ones before only
(``features``): the LSTM's window of ``STEP``-minute steps (mean and max demand relative
to now, rises and falls) and the static features (time of day and week, demand now,
rises in the last 15 minutes to a day, minutes since the last rise, the day-earlier
window, and the cluster's own arrival rates and peak excess over the last week)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from autotune.demand import DAY_MINUTES, WEEK_MINUTES, rises, targets, week_minute
from autotune.envs.traces import DemandSeries, helios_demand

if TYPE_CHECKING:
    from autotune.policies.forecast.config import ForecasterConfig

__all__ = [
    "F32",
    "F64",
    "I64",
    "STEP",
    "B",
    "Features",
    "cumulative",
    "features",
    "minute_of_week",
    "n_static",
    "read_demand",
    "rolling_sum",
]

STEP: Final = 5
"""Minutes per step of the LSTM's window."""
_COUNT_WINDOWS: Final = (15, 60, 240, 1440)

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


def read_demand(path: str | Path) -> DemandSeries:
    """A Helios-style CSV as GPU demand per minute (``autotune.envs.traces.helios_demand``)."""
    return helios_demand(path)


def n_static(horizons: Sequence[int]) -> int:
    """How many static features ``features`` builds for ``horizons``."""
    # time of day and week, demand now, rise counts, minutes since the last rise, the hour's
    # and day's high and the day's low, a rise in the last 15 minutes, the day-earlier
    # arrival and excess per horizon, the day's total rise.
    # Then per horizon the cluster's own arrival rates (all, after a busy and after a
    # quiet last h minutes) and its peak excess quantiles over the last week.
    return 4 + 1 + len(_COUNT_WINDOWS) + 1 + 3 + 1 + 2 * len(horizons) + 1 + 6 * len(horizons)


@dataclass(frozen=True, slots=True, eq=False)
class Features:
    window: F32
    """(n, steps, 4)"""
    static: F32
    """(n, n_static)"""


def rolling_sum(cum: F64, ends: I64, width: int) -> F64:
    """Sums over the ``width`` minutes up to and including each of ``ends``, from ``cum``
    (``cumulative`` of the values)."""
    lo = np.maximum(ends + 1 - width, 0)
    out: F64 = cum[ends + 1] - cum[lo]
    return out


def features(
    config: ForecasterConfig,
    demand: F64,
    capacity: float,
    ends: I64,
    minute_of_week: F64,
    origin: int = 0,
) -> Features:
    """Inputs for forecasts made at minutes ``ends`` of ``demand``, each from minutes up
    to and including its end only. ``minute_of_week`` is each end's minute of the week
    (0 = Monday 00:00); minutes before ``origin`` are padding, not data. Ends need
    ``config.history - 1`` minutes before them (pad a shorter history, as
    ``autotune.demand.DemandHistory`` does)."""
    if ends.size and int(ends.min()) < config.history - 1:
        raise ValueError(f"a forecast needs {config.history - 1} minutes of history before it")
    cap = max(float(capacity), 1.0)
    up = rises(demand)
    down = np.zeros(demand.size, dtype=bool)
    down[1:] = demand[1:] < demand[:-1]
    now = demand[ends]
    # The window: `window` steps of STEP minutes ending at each end.
    w = config.window
    minutes = ends[:, None] + np.arange(-w * STEP + 1, 1)[None, :]
    level = demand[minutes].reshape(len(ends), w, STEP)
    ups = up[minutes].reshape(len(ends), w, STEP).sum(axis=2)
    downs = down[minutes].reshape(len(ends), w, STEP).sum(axis=2)
    window = np.stack(
        [
            (level.mean(axis=2) - now[:, None]) / cap,
            (level.max(axis=2) - now[:, None]) / cap,
            ups / STEP,
            downs / STEP,
        ],
        axis=-1,
    )
    # Static features.
    cum_up = np.concatenate([[0.0], np.cumsum(up)])
    counts = [
        np.log1p(rolling_sum(cum_up, ends, width)) / math.log1p(width) for width in _COUNT_WINDOWS
    ]
    index = np.arange(demand.size)
    last_rise = np.maximum.accumulate(np.where(up, index, -1))[ends]
    since = np.where(last_rise >= 0, ends - last_rise, WEEK_MINUTES).clip(0, WEEK_MINUTES)
    day_window = sliding_window_view(demand, 60)
    high_hour = day_window[ends - 59].max(axis=1)
    day_max = sliding_window_view(demand, DAY_MINUTES)[ends - DAY_MINUTES + 1]
    high_day, low_day = day_max.max(axis=1), day_max.min(axis=1)
    ago = ends - DAY_MINUTES
    day_before = []
    for h in config.horizons:
        arrival, peak = targets(demand, ago, h)
        day_before += [arrival.astype(np.float64), (peak - demand[ago]) / cap]
    local = _local_rates(config, demand, cap, ends, up, cum_up, origin)
    rise_size = cumulative(np.maximum(np.diff(demand, prepend=demand[0]), 0.0))
    risen_day = rolling_sum(rise_size, ends, DAY_MINUTES) / cap
    day_angle = 2 * math.pi * (minute_of_week % DAY_MINUTES) / DAY_MINUTES
    week_angle = 2 * math.pi * minute_of_week / WEEK_MINUTES
    static = np.column_stack(
        [
            np.sin(day_angle),
            np.cos(day_angle),
            np.sin(week_angle),
            np.cos(week_angle),
            now / cap,
            *counts,
            np.log1p(since) / math.log1p(WEEK_MINUTES),
            (high_hour - now) / cap,
            (high_day - now) / cap,
            (now - low_day) / cap,
            (rolling_sum(cum_up, ends, 15) > 0).astype(np.float64),
            *day_before,
            np.log1p(risen_day),
            *local,
        ]
    )
    return Features(
        window=np.clip(window, -5, 5).astype(np.float32),
        static=np.clip(static, -5, 5).astype(np.float32),
    )


def _local_rates(
    config: ForecasterConfig,
    demand: F64,
    cap: float,
    ends: I64,
    up: B,
    cum_up: F64,
    origin: int,
) -> list[F64]:
    """What this cluster did over the last week (or what it has recorded of it, from
    ``origin``): per horizon, the rate of arrivals after a quiet and after a busy last h
    minutes (calibrated persistence fitted on the cluster's own past), and the peak
    excess's quantiles. Only windows that ended by each end count."""
    out: list[F64] = []
    n = demand.size
    for h in config.horizons:
        starts = np.arange(n - h, dtype=np.int64)
        arrival, peak = targets(demand, starts, h)
        recent = rolling_sum(cum_up, starts, h) > 0
        valid = starts >= origin + h
        a = np.where(valid, arrival, False).astype(np.float64)
        busy = (valid & recent).astype(np.float64)
        a_busy = a * busy
        cum_a, cum_v = cumulative(a), cumulative(valid.astype(np.float64))
        cum_b, cum_ab = cumulative(busy), cumulative(a_busy)
        # Windows known at an end t: those that started at or before t - h.
        last = np.clip(ends - h, 0, n - h - 1)
        k = 20.0  # prior weight, towards the all-cluster rate of the training data
        seen, arrived = (
            rolling_sum(cum_v, last, WEEK_MINUTES),
            rolling_sum(cum_a, last, WEEK_MINUTES),
        )
        seen_busy = rolling_sum(cum_b, last, WEEK_MINUTES)
        arrived_busy = rolling_sum(cum_ab, last, WEEK_MINUTES)
        base = (arrived + k * 0.15) / (seen + k)
        out += [
            base,
            (arrived_busy + k * 0.5) / (seen_busy + k),
            (arrived - arrived_busy + k * 0.1) / (seen - seen_busy + k),
        ]
        excess = np.where(valid, (peak - demand[starts]) / cap, np.nan)
        out += _week_quantiles(excess, last, config.quantiles)
    return out


def _week_quantiles(values: F64, last: I64, levels: Sequence[float]) -> list[F64]:
    """Per level, the quantile of ``values`` (NaN: not data) over the week up to and
    including each index of ``last``; 0 where there is none."""
    if len(last) <= 32:  # one live forecast: a slice, not a rolling pass over the series
        rows = []
        for i in last:
            part = values[max(0, int(i) - WEEK_MINUTES + 1) : int(i) + 1]
            part = part[~np.isnan(part)]
            rows.append(np.quantile(part, levels) if part.size else np.zeros(len(levels)))
        table = np.asarray(rows, dtype=np.float64).reshape(len(last), len(levels))
        return [table[:, j] for j in range(len(levels))]
    series = pd.Series(values)
    return [
        np.nan_to_num(
            series.rolling(WEEK_MINUTES, min_periods=1).quantile(q).to_numpy()[last], nan=0.0
        )
        for q in levels
    ]


def cumulative(values: F64) -> F64:
    out: F64 = np.concatenate([[0.0], np.cumsum(values)])
    return out


def minute_of_week(start: pd.Timestamp, ends: I64) -> F64:
    """Minute of the week (Monday 00:00 = 0) of minutes ``ends`` after ``start``."""
    out: F64 = week_minute(start.timestamp() / 60 + ends.astype(np.float64))
    return out
