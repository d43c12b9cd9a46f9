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
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import torch

from autotune.demand import DAY_MINUTES, QUANTILES, NoForecast, rises, targets
from autotune.envs.traces import DemandSeries
from autotune.errors import InputError
from autotune.policies.forecast.baselines import Baselines, Persistence, climatology
from autotune.policies.forecast.config import ForecasterConfig
from autotune.policies.forecast.features import (
    F64,
    I64,
    cumulative,
    minute_of_week,
    read_demand,
    rolling_sum,
)
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


# -- evaluation ------------------------------------------------------------------------


def _auc(score: F64, label: F64) -> float:
    """Area under the ROC curve (ties counted half)."""
    pos = label > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = pd.Series(score).rank(method="average").to_numpy()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _pinball_np(pred: F64, truth: F64, level: float) -> float:
    diff = truth - pred
    return float(np.mean(np.maximum(level * diff, (level - 1) * diff)))


def forecast_all(
    forecaster: Forecaster, series: DemandSeries, ends: I64
) -> dict[str, tuple[F64, F64]]:
    """Every predictor's (arrival probability, peak quantiles in GPUs) at ``ends``."""
    cfg = forecaster.config
    wm = minute_of_week(series.start, ends)
    d, cap = series.demand, series.capacity
    persistence = Persistence(cfg.baselines, cfg.horizons).predict(d, cap, ends, wm)
    return {
        "lstm": forecaster.predict(d, cap, ends, wm),
        "persistence": persistence,
        "climatology": climatology(cfg.baselines, d, ends, wm, cfg.horizons),
    }


def forecast_ends(forecaster: Forecaster, series: DemandSeries) -> I64:
    """The minutes a series is forecast at: every minute from the second day on (and
    from the forecaster's history on)."""
    first = max(DAY_MINUTES, forecaster.config.history - 1)
    return np.arange(first, series.minutes, dtype=np.int64)


def evaluate(
    forecaster: Forecaster, series: DemandSeries, *, from_day: float = 1.0
) -> dict[str, Any]:
    """Scores of the LSTM and the baselines on ``series`` at every minute from day
    ``from_day`` on whose target window lies inside it. Arrival: Brier, log loss, AUC
    (the persistence baseline is *calibrated* persistence); peak: pinball loss (GPUs) and
    coverage per quantile (the persistence baseline is persistence + buffer)."""
    cfg = forecaster.config
    ends = forecast_ends(forecaster, series)
    ends = ends[ends >= round(from_day * DAY_MINUTES)]
    report: dict[str, Any] = {"series": series.name, "capacity": series.capacity, "horizons": {}}
    h_max = max(cfg.horizons)
    ends = ends[ends + h_max < series.minutes]
    if ends.size == 0:
        raise InputError(f"{series.name}: too short to score (needs more than a day)")
    predictions = forecast_all(forecaster, series, ends)
    for i, h in enumerate(cfg.horizons):
        arrival, peak = targets(series.demand, ends, h)
        label = arrival.astype(np.float64)
        entry: dict[str, Any] = {"points": int(ends.size), "arrival_rate": float(label.mean())}
        for name, (prob, quant) in predictions.items():
            p = np.clip(prob[:, i], 1e-6, 1 - 1e-6)
            entry[name] = {
                "brier": float(np.mean((p - label) ** 2)),
                "log_loss": float(-np.mean(label * np.log(p) + (1 - label) * np.log(1 - p))),
                "auc": _auc(p, label),
                "pinball": {
                    str(q): _pinball_np(quant[:, i, j], peak, q) for j, q in enumerate(QUANTILES)
                },
                "coverage": {
                    str(q): float(np.mean(peak <= quant[:, i, j])) for j, q in enumerate(QUANTILES)
                },
            }
        # An oracle for reference: calibrated persistence refitted on the scored points.
        cum = cumulative(rises(series.demand).astype(np.float64))
        recent = rolling_sum(cum, ends, h) > 0
        refit = np.where(
            recent,
            label[recent].mean() if recent.any() else 0.0,
            label[~recent].mean() if (~recent).any() else 0.0,
        )
        entry["persistence_refit_brier"] = float(np.mean((refit - label) ** 2))
        lstm, pers = entry["lstm"], entry["persistence"]
        entry["brier_ratio"] = _ratio(lstm["brier"], pers["brier"])
        entry["pinball95_ratio"] = _ratio(lstm["pinball"]["0.95"], pers["pinball"]["0.95"])
        report["horizons"][str(h)] = entry
    return report


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def pooled(reports: Sequence[dict[str, Any]], horizons: Sequence[int]) -> dict[str, Any]:
    """Scores over all series' points together (each point weighted alike)."""
    out: dict[str, Any] = {}
    for h in horizons:
        entries = [r["horizons"][str(h)] for r in reports]
        n = np.array([e["points"] for e in entries], dtype=np.float64)
        agg: dict[str, Any] = {"points": int(n.sum())}
        for name in ("lstm", "persistence", "climatology"):
            agg[name] = {
                "brier": float(np.average([e[name]["brier"] for e in entries], weights=n)),
                "pinball": {
                    str(q): float(
                        np.average([e[name]["pinball"][str(q)] for e in entries], weights=n)
                    )
                    for q in QUANTILES
                },
                "coverage": {
                    str(q): float(
                        np.average([e[name]["coverage"][str(q)] for e in entries], weights=n)
                    )
                    for q in QUANTILES
                },
            }
        agg["brier_ratio"] = _ratio(agg["lstm"]["brier"], agg["persistence"]["brier"])
        agg["pinball95_ratio"] = _ratio(
            agg["lstm"]["pinball"]["0.95"], agg["persistence"]["pinball"]["0.95"]
        )
        out[str(h)] = agg
    return out


def predictions_frame(forecaster: Forecaster, series: DemandSeries) -> pd.DataFrame:
    """One row per forecast: ``series``, ``time`` (as in the series), ``horizon_min``,
    ``p_arrival``, ``q50``, ``q90``, ``q95`` (GPUs), made at every minute from the second
    day on from the data up to and including ``time`` only."""
    ends = forecast_ends(forecaster, series)
    wm = minute_of_week(series.start, ends)
    prob, peak = forecaster.predict(series.demand, series.capacity, ends, wm)
    frames = []
    for i, h in enumerate(forecaster.config.horizons):
        frames.append(
            pd.DataFrame(
                {
                    "series": series.name,
                    "time": series.time[ends],
                    "horizon_min": h,
                    "p_arrival": prob[:, i].round(6),
                    "q50": peak[:, i, 0].round(3),
                    "q90": peak[:, i, 1].round(3),
                    "q95": peak[:, i, 2].round(3),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


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
