"""Training (``train``): the network is fitted with log loss plus pinball loss on the
first days of each training series; on the last ``validation_days`` the quantiles are then
shifted so that each reaches its level (split conformal calibration) and the baselines
are fitted (``autotune.policies.forecast.baselines``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from autotune.demand import DAY_MINUTES, rises, targets
from autotune.envs.traces import DemandSeries
from autotune.errors import InputError
from autotune.policies.forecast.baselines import fit_baselines
from autotune.policies.forecast.config import ForecasterConfig
from autotune.policies.forecast.features import (
    F64,
    I64,
    Features,
    features,
    minute_of_week,
    rolling_sum,
)
from autotune.policies.forecast.model import Forecaster

__all__ = ["train"]


def _pinball(pred: torch.Tensor, truth: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    diff = truth[..., None] - pred
    return torch.maximum(levels * diff, (levels - 1) * diff).mean()


@dataclass(frozen=True, slots=True, eq=False)
class _Rows:
    feats: Features
    arrival: F64
    """(n, horizons)"""
    excess: F64
    """(n, horizons): (peak - D(t)) / capacity"""
    recent: F64
    """(n, horizons): an arrival in the last h minutes"""
    hour: I64


def _rows(
    config: ForecasterConfig, series: DemandSeries, lo: int, hi: int, stride: int
) -> _Rows | None:
    """Training rows made at minutes lo, lo + stride, ... < hi (targets inside)."""
    h_max = max(config.horizons)
    lo = max(lo, config.history - 1)
    hi = min(hi, series.minutes - h_max - 1)
    if hi <= lo:
        return None
    ends = np.arange(lo, hi, stride, dtype=np.int64)
    wm = minute_of_week(series.start, ends)
    feats = features(config, series.demand, series.capacity, ends, wm)
    arrival, excess, recent = [], [], []
    cum = np.concatenate([[0.0], np.cumsum(rises(series.demand))])
    for h in config.horizons:
        a, p = targets(series.demand, ends, h)
        arrival.append(a.astype(np.float64))
        excess.append((p - series.demand[ends]) / max(series.capacity, 1.0))
        recent.append((rolling_sum(cum, ends, h) > 0).astype(np.float64))
    return _Rows(
        feats=feats,
        arrival=np.column_stack(arrival),
        excess=np.column_stack(excess),
        recent=np.column_stack(recent),
        hour=((wm % DAY_MINUTES) // 60).astype(np.int64),
    )


def _concat(rows: Sequence[_Rows]) -> _Rows:
    return _Rows(
        feats=Features(
            window=np.concatenate([r.feats.window for r in rows]),
            static=np.concatenate([r.feats.static for r in rows]),
        ),
        arrival=np.concatenate([r.arrival for r in rows]),
        excess=np.concatenate([r.excess for r in rows]),
        recent=np.concatenate([r.recent for r in rows]),
        hour=np.concatenate([r.hour for r in rows]),
    )


def _offsets(
    config: ForecasterConfig, excess_pred: F64, truth: F64
) -> tuple[tuple[float, ...], ...]:
    """Per horizon and level, the shift s making P(truth <= pred + s) = level on the
    validation rows (split conformal)."""
    out = []
    for i in range(len(config.horizons)):
        residual = truth[:, i, None] - excess_pred[:, i, :]
        out.append(
            tuple(float(np.quantile(residual[:, j], q)) for j, q in enumerate(config.quantiles))
        )
    return tuple(out)


def train(
    series: Sequence[DemandSeries],
    config: ForecasterConfig,
    *,
    epochs: int = 8,
    stride: int = 2,
    batch: int = 512,
    lr: float = 3e-3,
    seed: int = 0,
    quantile_weight: float = 20.0,
    progress: Callable[[int, int, float], None] | None = None,
) -> Forecaster:
    """Fit a forecaster on ``series``: the first days of each (all but the last
    ``config.validation_days``) train the network and fit the baselines' probabilities;
    the last days calibrate its quantiles and choose the baselines' buffers.
    ``progress(epoch, epochs, loss)`` after each epoch."""
    if not series:
        raise InputError("no training series")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cut_back = round(config.validation_days * DAY_MINUTES)
    train_rows, valid_rows = [], []
    for s in series:
        cut = s.minutes - cut_back
        tr = _rows(config, s, 0, cut, stride)
        va = _rows(config, s, cut, s.minutes, 1)
        if tr is None or va is None:
            raise InputError(
                f"{s.name}: {s.minutes} minutes is too short; needs more than "
                f"{config.history + 2 * max(config.horizons)} minutes before its last "
                f"{config.validation_days:g} validation days and some after"
            )
        train_rows.append(tr)
        valid_rows.append(va)
    tr_all, va_all = _concat(train_rows), _concat(valid_rows)
    forecaster = Forecaster(config)
    model = forecaster.model
    x = torch.from_numpy(tr_all.feats.window)
    static = torch.from_numpy(tr_all.feats.static)
    y_arr = torch.from_numpy(tr_all.arrival.astype(np.float32))
    y_exc = torch.from_numpy(tr_all.excess.astype(np.float32))
    levels = torch.tensor(config.quantiles, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = math.ceil(len(x) / batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, total_steps=max(1, epochs * steps_per_epoch)
    )
    model.train()
    for epoch in range(epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        total = 0.0
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            logit, q = model(x[idx], static[idx])
            loss = nn.functional.binary_cross_entropy_with_logits(logit, y_arr[idx])
            loss = loss + quantile_weight * _pinball(q, y_exc[idx], levels)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(idx)
        if progress:
            progress(epoch + 1, epochs, total / len(x))
    model.eval()
    _, excess_valid = forecaster.raw(va_all.feats)
    config = replace(
        config,
        offsets=_offsets(config, excess_valid, va_all.excess),
        baselines=fit_baselines(
            config.horizons,
            config.quantiles,
            arrival=tr_all.arrival,
            recent=tr_all.recent,
            hour=tr_all.hour,
            valid_excess=va_all.excess,
        ),
    )
    forecaster.config = config
    model.config = config
    return forecaster
