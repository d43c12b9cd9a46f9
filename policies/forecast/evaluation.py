"""Scores of the LSTM and the baselines on a demand series (``score_forecasts``), over several
series' points together (``pooled``), and every forecast made on a series as a table
(``predictions_frame``). Arrival probability: Brier score, log loss and AUC; peak
demand: pinball loss in GPUs and coverage per quantile."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from autotune.demand import DAY_MINUTES, QUANTILES, rises, targets
from autotune.envs.traces import DemandSeries
from autotune.errors import InputError
from autotune.policies.forecast.baselines import Persistence, climatology
from autotune.policies.forecast.features import (
    F64,
    I64,
    cumulative,
    minute_of_week,
    rolling_sum,
)
from autotune.policies.forecast.model import Forecaster

__all__ = ["forecast_all", "forecast_ends", "pooled", "predictions_frame", "score_forecasts"]


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


def score_forecasts(
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
