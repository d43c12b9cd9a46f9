"""GPU demand and its forecast, as the environment, the daemon and the API share them.

A cluster's **demand** at a moment is the GPUs its running jobs hold plus the GPUs its
pending jobs ask for (``ClusterSnapshot.demand_gpus``). ``DemandHistory`` puts it on
real minutes whatever the tick or round period. A ``DemandForecaster`` (the LSTM in
``autotune.policies.forecast``, its named persistence fallback, or ``NoForecast``) turns
those minutes into a ``DemandForecast``: per horizon the probability that new demand
arrives and the quantiles of the peak demand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "DAY_MINUTES",
    "HORIZONS",
    "QUANTILES",
    "WEEK_MINUTES",
    "DemandForecast",
    "DemandForecaster",
    "DemandHistory",
    "NoForecast",
    "rises",
    "series_forecasts",
    "targets",
    "week_minute",
]

DAY_MINUTES: Final = 1440
WEEK_MINUTES: Final = 7 * DAY_MINUTES
HORIZONS: Final = (15, 60)
"""Minutes ahead every forecaster predicts."""
QUANTILES: Final = (0.5, 0.9, 0.95)
"""Levels of the peak-demand quantiles."""

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def week_minute(minute: Any) -> Any:
    """Minute of the week (Monday 00:00 = 0) of ``minute`` minutes since the Unix epoch
    (a Thursday), a number or an array; a simulated clock starting at 0 starts on a
    Thursday too."""
    return (minute + 3 * DAY_MINUTES) % WEEK_MINUTES


def rises(demand: F64) -> npt.NDArray[np.bool_]:
    """``rises[k]``: D(k) > D(k-1) (the first minute never rises)."""
    out = np.zeros(demand.size, dtype=bool)
    out[1:] = demand[1:] > demand[:-1]
    return out


def targets(demand: F64, ends: I64, horizon: int) -> tuple[npt.NDArray[np.bool_], F64]:
    """What a forecast made at each minute of ``ends`` is scored against: the **arrival**
    (any minute k in (t, t+h] with D(k) > D(k-1)) and the **peak** (max D over (t, t+h]);
    every ``end + horizon`` must be inside the series."""
    if ends.size and int(ends.max()) + horizon >= demand.size:
        raise ValueError("a target window runs past the series")
    counts = np.concatenate([[0], np.cumsum(rises(demand))])
    arrival = counts[ends + horizon + 1] - counts[ends + 1] > 0
    peaks: F64 = sliding_window_view(demand[1:], horizon).max(axis=1)
    return arrival, peaks[ends]


@dataclass(frozen=True, slots=True)
class DemandForecast:
    """One forecast: per horizon (minutes) the probability that new demand arrives and
    the peak demand's quantiles in GPUs (levels ``QUANTILES``)."""

    predictor: str
    demand: float
    """GPU demand now."""
    capacity: float
    """The cluster's GPUs."""
    p_arrival: dict[int, float]
    quantiles: dict[int, tuple[float, ...]]

    def quantile(self, horizon: int, level: float) -> float:
        return self.quantiles[horizon][QUANTILES.index(level)]

    def headroom(self, horizon: int = 60, level: float = 0.95) -> float:
        """Share of the cluster's GPUs still free if demand reaches the ``level``
        quantile of its peak within ``horizon`` minutes (0 when it would not fit)."""
        if self.capacity <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.quantile(horizon, level) / self.capacity))


@runtime_checkable
class DemandForecaster(Protocol):
    name: str
    """Shown next to every forecast, e.g. ``lstm`` or ``persistence + buffer``."""

    @property
    def history(self) -> int:
        """Minutes of history one forecast reads (its own minute included)."""
        ...

    def predict(
        self, demand: F64, capacity: float, ends: I64, week_minute: F64, origin: int = 0
    ) -> tuple[F64, F64]:
        """Forecasts made at minutes ``ends`` of the per-minute ``demand`` from minutes up
        to and including each end only: arrival probabilities (n, len(HORIZONS)) and peak
        quantiles in GPUs (n, len(HORIZONS), len(QUANTILES)). ``week_minute``: each end's
        minute of the week; minutes before ``origin`` are padding, not data."""
        ...


class NoForecast:
    """No forecast at all (the ablation's ``none``): no arrival expected, the peak is
    demand now."""

    name = "none"
    history = 1

    def predict(
        self, demand: F64, capacity: float, ends: I64, week_minute: F64, origin: int = 0
    ) -> tuple[F64, F64]:
        del capacity, week_minute, origin
        prob = np.zeros((len(ends), len(HORIZONS)))
        peak = np.repeat(demand[ends][:, None, None], len(HORIZONS), axis=1)
        return prob, np.repeat(peak, len(QUANTILES), axis=2)


class DemandHistory:
    """GPU demand on real minutes, whatever the tick or round period: each minute holds
    the newest value recorded in it, and a minute without a record holds the one before.
    Feed it ``record(time_s, demand)`` as the cluster's clock advances."""

    def __init__(self, keep_minutes: int = 8 * DAY_MINUTES) -> None:
        self.keep = keep_minutes
        self._buf = np.empty(0, dtype=np.float64)
        """The minutes kept are ``_buf[_lo:_hi]``: an array that grows and is compacted
        as minutes are added (a forecast reads them without a copy)."""
        self._lo = self._hi = 0
        self._first: int | None = None
        """Minute (since the clock's origin) of the oldest minute kept."""

    @property
    def _values(self) -> np.ndarray:
        return self._buf[self._lo : self._hi]

    def __len__(self) -> int:
        return self._hi - self._lo

    def clear(self) -> None:
        self._buf = np.empty(0, dtype=np.float64)
        self._lo = self._hi = 0
        self._first = None

    def copy_from(self, other: DemandHistory) -> None:
        self._buf = other._values.copy()
        self._lo, self._hi = 0, len(self._buf)
        self._first = other._first

    @property
    def first_minute(self) -> int | None:
        """The oldest minute kept (minutes since the clock's origin)."""
        return self._first

    def minutes_recorded(self) -> list[float]:
        """Demand at every minute kept, oldest first."""
        return [float(v) for v in self._values]

    @property
    def last_minute(self) -> int | None:
        return None if self._first is None else self._first + len(self) - 1

    def record(self, time_s: float, demand: float) -> None:
        minute = math.floor(time_s / 60)
        last = self.last_minute
        if last is None:
            self._buf = np.empty(64, dtype=np.float64)
            self._buf[0] = float(demand)
            self._lo, self._hi, self._first = 0, 1, minute
            return
        if minute <= last:
            self._buf[self._hi - 1] = float(demand)
            return
        gap = minute - last - 1
        previous = self._buf[self._hi - 1]
        kept_gap = min(gap, self.keep)  # minutes older than ``keep`` would be dropped
        self._first = (self._first or 0) + (gap - kept_gap)
        self._room(kept_gap + 1)
        self._buf[self._hi : self._hi + kept_gap] = previous
        self._buf[self._hi + kept_gap] = float(demand)
        self._hi += kept_gap + 1
        drop = len(self) - self.keep
        if drop > 0:
            self._lo += drop
            self._first += drop

    def _room(self, more: int) -> None:
        """Space for ``more`` minutes after the newest, moving the kept ones to the front
        (and growing the array) when the end is reached."""
        if self._hi + more <= self._buf.size:
            return
        n = len(self)
        size = max(self._buf.size, 2 * (n + more))
        buf = np.empty(size, dtype=np.float64)
        buf[:n] = self._buf[self._lo : self._hi]
        self._buf, self._lo, self._hi = buf, 0, n

    def forecast(self, forecaster: DemandForecaster, capacity: float) -> DemandForecast:
        """The forecast made now from every minute kept (padded with the first one where
        fewer than the forecaster reads)."""
        if not len(self):
            raise ValueError("no demand recorded yet")
        need = max(forecaster.history, 1)
        values = self._values
        origin = max(0, need - values.size)
        if origin:
            values = np.concatenate([np.full(origin, values[0]), values])
        end = np.array([values.size - 1], dtype=np.int64)
        minute = np.array([week_minute(float(self.last_minute or 0))])
        prob, peak = forecaster.predict(values, capacity, end, minute, origin)
        return DemandForecast(
            predictor=forecaster.name,
            demand=float(values[-1]),
            capacity=float(capacity),
            p_arrival={h: float(prob[0, i]) for i, h in enumerate(HORIZONS)},
            quantiles={h: tuple(float(x) for x in peak[0, i]) for i, h in enumerate(HORIZONS)},
        )


def series_forecasts(
    forecaster: DemandForecaster,
    demand: Sequence[float],
    first_minute: int,
    capacity: float,
) -> tuple[F64, F64]:
    """Forecasts made at every minute of a per-minute series whose first value is minute
    ``first_minute`` of the clock: each from that minute and the ones before only."""
    values = np.asarray(demand, dtype=np.float64)
    origin = max(0, forecaster.history - 1)
    padded = np.concatenate([np.full(origin, values[0] if values.size else 0.0), values])
    ends = np.arange(origin, padded.size, dtype=np.int64)
    minutes = np.array([week_minute(first_minute + i) for i in range(values.size)])
    return forecaster.predict(padded, capacity, ends, minutes, origin)
