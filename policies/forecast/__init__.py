"""The demand forecaster: an LSTM that predicts, from a cluster's GPU demand per minute,
whether new demand arrives in the next 15 and 60 minutes and how high demand peaks.

**Targets** (anyone can score them from the series). With D(t) the GPUs running plus
the GPUs pending at minute t:

- an **arrival** in (t, t+h] is any minute k in that window with D(k) > D(k-1); the
  forecaster gives its probability (scored by Brier score and log loss);
- the **peak** over (t, t+h] is max D(k) for k in that window; the forecaster gives its
  50%, 90% and 95% quantiles in GPUs (scored by pinball loss and coverage).

Time is in real minutes whatever the series' resolution (``helios_demand`` puts a file on
a one-minute grid; ``DemandHistory`` does the same for the daemon's ticks and the
environment's rounds).

**The network** (``DemandLSTM``): an LSTM over the last ``window`` five-minute steps (per
step: mean and max demand relative to now, rises and falls), its last state joined with
static features (time of day and week, demand now, rises in the last 15 minutes to a
day, minutes since the last rise, the day-earlier window), and one head per horizon
giving the arrival logit and the three quantiles of the peak's excess over demand now,
in units of the cluster's GPUs, kept in order. It is trained with log loss plus pinball
loss; the quantiles are then shifted so that each reaches its level on the validation
days (split conformal calibration).

**Baselines**, fitted on the same training and validation data and stored with the
checkpoint (``Baselines``): *calibrated persistence* (P(arrival | an arrival in the
last h minutes or not)), *climatology* (the arrival rate at that hour of the day; the
peak quantiles of the last week's demand) and *persistence + buffer* (demand now plus a
fixed share of the cluster's GPUs per quantile, chosen on the validation days: the
Helios CES rule).

Checkpoints are a folder with ``config.json`` (``ForecasterConfig``, the baselines and
the calibration included) and ``model.pt``. One ships in the package
(``autotune/data/forecaster``), trained on seven Helios virtual clusters
(``TRAIN_SERIES``); the other three are never trained on.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Final

import torch

from autotune.demand import NoForecast
from autotune.errors import InputError
from autotune.policies.forecast.baselines import Baselines, Persistence
from autotune.policies.forecast.config import ForecasterConfig
from autotune.policies.forecast.evaluation import evaluate, pooled, predictions_frame
from autotune.policies.forecast.features import minute_of_week, read_demand
from autotune.policies.forecast.model import DemandLSTM, Forecaster
from autotune.policies.forecast.training import train

__all__ = [
    "FORECASTS",
    "TRAIN_SERIES",
    "Baselines",
    "DemandLSTM",
    "Forecaster",
    "ForecasterConfig",
    "Persistence",
    "default_checkpoint",
    "demand_forecaster",
    "evaluate",
    "load_checkpoint",
    "minute_of_week",
    "pooled",
    "predictions_frame",
    "read_demand",
    "save_checkpoint",
    "train",
]

TRAIN_SERIES: Final = (
    "earth_vc3sl",
    "earth_vc6YE",
    "earth_vc8Sj",
    "earth_vcJLV",
    "earth_vcJkd",
    "earth_vcLJZ",
    "earth_vcMod",
)
"""The Helios virtual clusters the shipped checkpoint was trained on; the other three
(``earth_vcSoL``, ``earth_vcTJs``, ``earth_vccaA``) are never trained on."""


# -- checkpoints -----------------------------------------------------------------------


def save_checkpoint(forecaster: Forecaster, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(forecaster.config.to_json(), indent=1) + "\n")
    torch.save(forecaster.model.state_dict(), out / "model.pt")
    return out


def load_checkpoint(path: str | Path) -> Forecaster:
    """A forecaster saved by ``save_checkpoint``; ``InputError`` if the folder isn't one."""
    path = Path(path)
    try:
        config = ForecasterConfig.from_json(json.loads((path / "config.json").read_text()))
        state = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        model = DemandLSTM(config)
        model.load_state_dict(state)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise InputError(f"not a forecaster checkpoint: {exc}", path=str(path)) from None
    return Forecaster(config, model)


def default_checkpoint() -> Path:
    """The checkpoint shipped in the package."""
    return Path(str(resources.files("autotune") / "data" / "forecaster"))


FORECASTS: Final = ("lstm", "persistence", "none")
"""What fills the observation's forecast features and the provisioning's target: the
LSTM, its named fallback (calibrated persistence and persistence + buffer, fitted with
the checkpoint), or nothing (``NoForecast``)."""


def demand_forecaster(
    kind: str = "lstm", checkpoint: str | Path | None = None
) -> Forecaster | Persistence | NoForecast:
    """The forecaster ``kind`` (one of ``FORECASTS``) from ``checkpoint`` (default: the
    one shipped)."""
    if kind not in FORECASTS:
        raise InputError(f"forecast {kind!r}: one of {', '.join(FORECASTS)}")
    if kind == "none":
        return NoForecast()
    forecaster = _load(str(checkpoint or default_checkpoint()))
    if kind == "persistence":
        return Persistence(forecaster.config.baselines, forecaster.config.horizons)
    return forecaster


@functools.lru_cache(maxsize=4)
def _load(path: str) -> Forecaster:
    return load_checkpoint(path)
