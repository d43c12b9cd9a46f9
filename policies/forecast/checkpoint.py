"""Checkpoints: a folder with ``config.json`` (``ForecasterConfig``, the baselines and the
calibration included) and ``model.pt`` (``save_checkpoint``, ``load_checkpoint``). One
ships in the package (``autotune/data/forecaster``, ``default_checkpoint``), trained on
seven Helios virtual clusters (``TRAIN_SERIES``); the other three are never trained on.
``demand_forecaster`` gives the forecaster one of ``FORECASTS`` names (the LSTM, its
persistence fallback, or none) from a checkpoint, the shipped one by default."""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Final

import torch

from autotune.demand import NoForecast
from autotune.errors import InputError
from autotune.policies.forecast.baselines import Persistence
from autotune.policies.forecast.config import ForecasterConfig
from autotune.policies.forecast.model import DemandLSTM, Forecaster

__all__ = [
    "FORECASTS",
    "TRAIN_SERIES",
    "default_checkpoint",
    "demand_forecaster",
    "load_checkpoint",
    "save_checkpoint",
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
