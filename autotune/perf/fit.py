"""One least-squares fitter for the performance model's coefficients, shared by the Pollux
fits (``autotune.studies.pollux.fit``) and the executor's calibration
(``autotune.executor.calibrate``).

Each free parameter has a start value and physical bounds, and is fitted on a log scale
(``log_scale``, the default: sizes span orders of magnitude, a link latency of 1e-7 s
and an overhead of 0.1 s in one fit) or, for one that may be 0, on its own scale. The
loss is soft-L1, so a few noisy measurements cannot drag the fit (scipy's
``least_squares``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Parameter", "fit_bounded", "mape"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameter:
    name: str
    start: float
    low: float
    high: float
    log_scale: bool = True
    """Fit ``log(value)``: only for parameters whose bounds are both > 0."""

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"Parameter {self.name}: low={self.low} must be < high={self.high}")
        if not self.low <= self.start <= self.high:
            raise ValueError(f"Parameter {self.name}: start={self.start} outside [low, high]")
        if self.log_scale and self.low <= 0:
            raise ValueError(f"Parameter {self.name}: a log-scale parameter needs low > 0")

    def encode(self, value: float) -> float:
        return math.log(value) if self.log_scale else value

    def decode(self, theta: float) -> float:
        value = math.exp(theta) if self.log_scale else float(theta)
        return min(max(value, self.low), self.high)


def fit_bounded(
    parameters: Sequence[Parameter],
    residuals: Callable[[Mapping[str, float]], npt.NDArray[np.float64]],
) -> dict[str, float]:
    """The parameter values (by name, within their bounds) that minimise the soft-L1 norm
    of ``residuals(values)``, starting from each parameter's ``start``."""
    from scipy.optimize import least_squares

    lower = np.array([p.encode(p.low) for p in parameters])
    upper = np.array([p.encode(p.high) for p in parameters])
    theta0 = np.clip([p.encode(p.start) for p in parameters], lower + 1e-9, upper - 1e-9)

    def decode(theta: npt.NDArray[np.float64]) -> dict[str, float]:
        return {p.name: p.decode(x) for p, x in zip(parameters, theta, strict=True)}

    result = least_squares(
        lambda theta: residuals(decode(theta)), theta0, bounds=(lower, upper), loss="soft_l1"
    )
    return decode(result.x)


def mape(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Mean absolute percentage error, as a fraction (0.05 is 5%)."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(p - m) / m))
