"""Interval statistics, one function per statistic, named for it.

- ``percentile_interval``: the percentile interval of bootstrap resamples (the off-policy
  estimates' episode bootstrap, a benchmark's bootstrap over jobs);
- ``mean_t_interval``: the mean of a few independent runs (seeds) and its two-sided
  Student-t interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["mean_t_interval", "percentile_interval"]


def percentile_interval(samples: Sequence[float] | np.ndarray, level: float) -> tuple[float, float]:
    """The two-sided percentile interval at ``level`` of bootstrap ``samples`` (resamples
    that failed, NaN, left out; NaN bounds when none is left)."""
    values = np.asarray(samples, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    return float(low), float(high)


def mean_t_interval(values: Sequence[float], level: float = 0.95) -> dict[str, float | None]:
    """The mean of ``values`` (NaN left out) and its two-sided Student-t interval at
    ``level``: ``{"mean", "low", "high"}``, the bounds ``None`` with fewer than two values
    and every entry ``None`` with none."""
    from scipy import stats

    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size == 0:
        return {"mean": None, "low": None, "high": None}
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "low": None, "high": None}
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return {"mean": mean, "low": mean - half, "high": mean + half}
