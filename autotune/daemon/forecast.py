"""Load forecasts in the daemon: the named fallback and the replay of a forecaster over a
series (the interface, ``LoadForecaster``, is in ``autotune.interfaces``).

The daemon forecasts the cluster's GPU utilisation from its own history (the
``gpu_utilization`` samples it stores every tick). A learned forecaster plugs in by
implementing ``LoadForecaster``; until one is configured, ``PersistenceForecaster``
(tomorrow looks like today: the last value) is used, and every response names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.interfaces import LoadForecaster

__all__ = ["ForecastSeries", "PersistenceForecaster", "forecast_series"]


class PersistenceForecaster:
    """The fallback: the last value seen, whatever the horizon."""

    name = "persistence (last value)"

    def predict(self, history: Sequence[float], horizon: int) -> float:
        if not history:
            raise ValueError("history: needs at least one sample")
        return float(history[-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastSeries:
    predicted: list[tuple[int, float]]
    """(index of the sample the prediction is for, predicted value)."""
    current: float | None
    """The prediction for ``horizon`` samples after the newest one."""
    mean_absolute_error: float | None


def forecast_series(
    values: Sequence[float], forecaster: LoadForecaster, *, horizon: int = 1
) -> ForecastSeries:
    """Replay ``forecaster`` over ``values``: every sample from index ``horizon`` on
    gets the prediction made from the samples up to ``horizon`` before it."""
    if horizon < 1:
        raise ValueError(f"horizon={horizon}: must be >= 1")
    predicted = [
        (i, forecaster.predict(values[: i - horizon + 1], horizon))
        for i in range(horizon, len(values))
    ]
    errors = [abs(values[i] - p) for i, p in predicted]
    return ForecastSeries(
        predicted=predicted,
        current=forecaster.predict(values, horizon) if values else None,
        mean_absolute_error=sum(errors) / len(errors) if errors else None,
    )
