"""``ForecasterConfig``: the forecaster's shape (the LSTM's window and width, the horizons
and quantiles), what it was trained on, and what was fitted with it (the quantiles'
calibration offsets, the ``Baselines``); a checkpoint's ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.demand import DAY_MINUTES, HORIZONS, QUANTILES
from autotune.policies.forecast.baselines import Baselines
from autotune.policies.forecast.features import STEP

__all__ = ["ForecasterConfig"]


@dataclass(frozen=True, slots=True)
class ForecasterConfig:
    window: int = 48
    """Five-minute steps of history the LSTM reads (48: four hours)."""
    hidden: int = 32
    horizons: tuple[int, ...] = HORIZONS
    quantiles: tuple[float, ...] = QUANTILES
    trained_on: tuple[str, ...] = field(default_factory=tuple)
    validation_days: float = 10.0
    """The last days of each training series, held out for calibration and baselines."""
    offsets: tuple[tuple[float, ...], ...] = ()
    """Per horizon, per quantile: the calibration shift of the predicted excess (share of
    the cluster's GPUs), chosen on the validation days."""
    baselines: Baselines = field(default_factory=Baselines)

    def to_json(self) -> dict[str, Any]:
        data = {
            "window": self.window,
            "hidden": self.hidden,
            "horizons": list(self.horizons),
            "quantiles": list(self.quantiles),
            "trained_on": list(self.trained_on),
            "validation_days": self.validation_days,
            "offsets": [list(o) for o in self.offsets],
            "baselines": self.baselines.to_json(),
        }
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> ForecasterConfig:
        return ForecasterConfig(
            window=int(data["window"]),
            hidden=int(data["hidden"]),
            horizons=tuple(int(h) for h in data["horizons"]),
            quantiles=tuple(float(q) for q in data["quantiles"]),
            trained_on=tuple(data["trained_on"]),
            validation_days=float(data["validation_days"]),
            offsets=tuple(tuple(float(x) for x in o) for o in data["offsets"]),
            baselines=Baselines.from_json(data["baselines"]),
        )

    @property
    def history(self) -> int:
        """Minutes of history one forecast reads, its own minute included: a day (the
        day-earlier window), or the LSTM's window if longer."""
        return max(DAY_MINUTES, self.window * STEP) + 1
