"""LSTM forecaster of cluster load: GPU utilisation and pending GPU demand, 1 to 60
minutes ahead, from the last ``window`` minutes.

What makes it beat persistence on per-minute cluster load:

- it predicts the *change* from the last value, not the level, so "nothing changes" is
  the network's zero output and it learns only departures from persistence;
- every input window is normalised by its own scale (``max(std(window), floor)``), so one
  model serves clusters of any size and either column (utilisation, pending GPUs);
- it is trained with the L1 loss, the MAE it is judged by;
- besides the window it sees the time of day and the same window's values a day earlier
  (and what followed them), the daily cycle a seasonal-naive forecast uses.

Checkpoints are a folder with ``config.json`` (``ForecasterConfig``) and ``model.pt``
(the state dict). One ships in the package (``autotune/data/forecaster``), trained on
seven Helios virtual clusters; ``TRAIN_SERIES`` names them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import torch
from torch import nn

from autotune.envs.traces import helios_load
from autotune.errors import InputError

__all__ = [
    "DAY_MINUTES",
    "TRAIN_SERIES",
    "EnvForecast",
    "Forecaster",
    "ForecasterConfig",
    "LoadLSTM",
    "default_checkpoint",
    "evaluate_series",
    "load_checkpoint",
    "read_series",
    "save_checkpoint",
    "train",
]

DAY_MINUTES: Final = 1440
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
(``earth_vcSoL``, ``earth_vcTJs``, ``earth_vccaA``) are its validation series."""

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ForecasterConfig:
    window: int = 60
    """Minutes of history the network reads."""
    horizons: tuple[int, ...] = (1, 5, 15, 30, 60)
    """Minutes ahead it predicts, one output each."""
    hidden: int = 48
    layers: int = 1
    scale_floor: float = 0.01
    """Smallest normalising scale, as a share of the series' typical level (see
    ``Forecaster.scale_of``)."""
    columns: tuple[str, ...] = ("gpu_utilization", "pending_gpu_num")
    """Columns it was trained on."""
    trained_on: tuple[str, ...] = field(default_factory=tuple)

    @staticmethod
    def from_json(data: dict[str, Any]) -> ForecasterConfig:
        data = dict(data)
        for key in ("horizons", "columns", "trained_on"):
            if key in data:
                data[key] = tuple(data[key])
        return ForecasterConfig(**data)


# Static features: time of day (sin, cos), then per horizon the day-earlier change.
def _n_static(config: ForecasterConfig) -> int:
    return 2 + len(config.horizons)


class LoadLSTM(nn.Module):
    """The network: an LSTM over the normalised window, its last state joined with the
    static features, an MLP head giving the normalised change at each horizon."""

    def __init__(self, config: ForecasterConfig) -> None:
        super().__init__()
        self.config = config
        # Per step: the normalised value and the value a day earlier (normalised alike).
        self.lstm = nn.LSTM(2, config.hidden, num_layers=config.layers, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(config.hidden + _n_static(config), config.hidden),
            nn.Tanh(),
            nn.Linear(config.hidden, len(config.horizons)),
        )

    def forward(self, window: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
        """``window`` (batch, steps, 2), ``static`` (batch, n_static) -> (batch, horizons)."""
        out, _ = self.lstm(window)
        result: torch.Tensor = self.head(torch.cat([out[:, -1], static], dim=1))
        return result


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    """One load column sampled every minute, with each row's minute of the day."""

    name: str
    column: str
    values: F64
    minute_of_day: F64


def read_series(path: str | Path, column: str = "gpu_utilization") -> Series:
    """A Helios-style CSV (``time`` and ``column``) as a per-minute series. Rows are taken
    as consecutive minutes (Helios has no gaps; a gap would shorten the day)."""
    load = helios_load(path, column)
    first = pd.read_csv(path, usecols=["time"], nrows=1)["time"].iloc[0]
    start = pd.Timestamp(str(first))
    offset = start.hour * 60 + start.minute + start.second / 60
    minute_of_day = (offset + np.asarray(load.minutes)) % DAY_MINUTES
    if len(load.values) < 2:
        raise InputError("needs at least two rows", path=str(path), column=column)
    return Series(
        name=load.name,
        column=column,
        values=np.asarray(load.values, dtype=np.float64),
        minute_of_day=minute_of_day,
    )


class Forecaster:
    """A trained ``LoadLSTM`` with the arithmetic around it: normalisation and
    features in, levels out. Runs on CPU."""

    def __init__(self, config: ForecasterConfig, model: LoadLSTM | None = None) -> None:
        self.config = config
        self.model = model or LoadLSTM(config)
        self.model.eval()

    # -- features ---------------------------------------------------------------------

    @property
    def history(self) -> int:
        """Minutes of history one prediction needs: a day plus the window."""
        return DAY_MINUTES + self.config.window

    def scale_of(self, window: F64, level: float) -> F64:
        """The normalising scale of each window: its standard deviation, at least
        ``scale_floor`` times the series' typical level (``level``)."""
        floor = max(self.config.scale_floor * level, 1e-6)
        scale: F64 = np.maximum(window.std(axis=-1), floor)
        return scale

    def features(
        self, series: Series, ends: npt.NDArray[np.int64], level: float
    ) -> tuple[F32, F32, F64, F64]:
        """Network inputs for predictions made at rows ``ends`` (the last row seen; each
        needs ``history - 1`` rows before it): window, static features, last value and
        scale."""
        cfg = self.config
        v = series.values
        w = cfg.window
        steps = np.arange(-w + 1, 1)
        idx = ends[:, None] + steps[None, :]
        window = v[idx]
        day = v[idx - DAY_MINUTES]
        last = window[:, -1]
        scale = self.scale_of(window, level)
        x = np.stack(
            [(window - last[:, None]) / scale[:, None], (day - last[:, None]) / scale[:, None]],
            axis=-1,
        )
        angle = 2 * math.pi * series.minute_of_day[ends] / DAY_MINUTES
        horizons = np.asarray(cfg.horizons)
        ahead = v[ends[:, None] + horizons[None, :] - DAY_MINUTES]
        seasonal = (ahead - day[:, -1:]) / scale[:, None]
        static = np.concatenate([np.sin(angle)[:, None], np.cos(angle)[:, None], seasonal], 1)
        return (
            np.clip(x, -20, 20).astype(np.float32),
            np.clip(static, -20, 20).astype(np.float32),
            last,
            scale,
        )

    @staticmethod
    def level_of(values: F64) -> float:
        """The series' typical level: the mean absolute value of what has been seen."""
        return float(np.mean(np.abs(values))) or 1.0

    # -- prediction -------------------------------------------------------------------

    def predict(self, series: Series, ends: npt.NDArray[np.int64], *, batch: int = 4096) -> F64:
        """Predicted levels (len(ends), horizons) made at rows ``ends``."""
        out = np.empty((len(ends), len(self.config.horizons)))
        with torch.inference_mode():
            for start in range(0, len(ends), batch):
                chunk = ends[start : start + batch]
                level = self.level_of(series.values[: int(chunk.max()) + 1])
                x, s, last, scale = self.features(series, chunk, level)
                delta = self.model(torch.from_numpy(x), torch.from_numpy(s)).numpy()
                out[start : start + len(chunk)] = last[:, None] + delta * scale[:, None]
        return out

    def predict_next(
        self,
        history: Sequence[float] | F64,
        minute_of_day: float,
        horizon: int,
    ) -> float:
        """One prediction from per-minute ``history`` (oldest first) made at
        ``minute_of_day``: the value ``horizon`` minutes later. A history shorter than
        ``self.history`` is padded with its first value."""
        if horizon not in self.config.horizons:
            raise ValueError(f"horizon {horizon}: the model predicts {self.config.horizons}")
        values = np.asarray(history, dtype=np.float64)[-self.history :]
        if values.size == 0:
            raise ValueError("empty history")
        if values.size < self.history:
            values = np.concatenate([np.full(self.history - values.size, values[0]), values])
        n = values.size
        minutes = np.asarray((minute_of_day - (n - 1 - np.arange(n))) % DAY_MINUTES, np.float64)
        series = Series(name="live", column="", values=values, minute_of_day=minutes)
        pred = self.predict(series, np.array([n - 1]))
        return float(pred[0, self.config.horizons.index(horizon)])


def _ends(n: int, need: int, horizon_max: int, stride: int) -> npt.NDArray[np.int64]:
    return np.arange(need - 1, n - horizon_max, stride, dtype=np.int64)


def train(
    series: Sequence[Series],
    config: ForecasterConfig,
    *,
    epochs: int = 6,
    stride: int = 3,
    batch: int = 512,
    lr: float = 2e-3,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
) -> Forecaster:
    """Fit a forecaster on ``series`` (every ``stride``-th minute as a sample) with the
    L1 loss on the normalised change; ``progress(epoch, epochs, loss)`` after each."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    forecaster = Forecaster(config)
    h_max = max(config.horizons)
    xs: list[F32] = []
    ss: list[F32] = []
    ys: list[F32] = []
    horizons = np.asarray(config.horizons)
    for s in series:
        ends = _ends(len(s.values), forecaster.history, h_max, stride)
        if ends.size == 0:
            raise InputError(f"{s.name}: shorter than a day plus {config.window + h_max} minutes")
        level = forecaster.level_of(s.values)
        x, st, last, scale = forecaster.features(s, ends, level)
        future = s.values[ends[:, None] + horizons[None, :]]
        xs.append(x)
        ss.append(st)
        ys.append(np.clip((future - last[:, None]) / scale[:, None], -20, 20).astype(np.float32))
    x_all = torch.from_numpy(np.concatenate(xs))
    s_all = torch.from_numpy(np.concatenate(ss))
    y_all = torch.from_numpy(np.concatenate(ys))
    model = forecaster.model
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps_per_epoch = math.ceil(len(x_all) / batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, total_steps=max(1, epochs * steps_per_epoch)
    )
    for epoch in range(epochs):
        order = torch.from_numpy(rng.permutation(len(x_all)))
        total = 0.0
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            loss = nn.functional.l1_loss(model(x_all[idx], s_all[idx]), y_all[idx])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(idx)
        if progress:
            progress(epoch + 1, epochs, total / len(x_all))
    model.eval()
    return forecaster


def evaluate_series(forecaster: Forecaster, series: Series, horizon: int) -> dict[str, Any]:
    """MAE and RMSE at ``horizon`` minutes of the LSTM, persistence (the last value) and
    seasonal naive (the value a day before the target), on the same points: every minute
    with a day and a window of history and the target inside the series."""
    cfg = forecaster.config
    if horizon not in cfg.horizons:
        raise InputError(f"--horizon {horizon}: the model predicts {list(cfg.horizons)} minutes")
    v = series.values
    ends = _ends(len(v), forecaster.history, horizon, 1)
    if ends.size == 0:
        raise InputError(
            f"{series.name}: too short; needs more than {forecaster.history + horizon} rows"
        )
    truth = v[ends + horizon]
    predictions = {
        "lstm": forecaster.predict(series, ends)[:, cfg.horizons.index(horizon)],
        "persistence": v[ends],
        "seasonal_naive": v[ends + horizon - DAY_MINUTES],
    }
    mae = {k: float(np.mean(np.abs(p - truth))) for k, p in predictions.items()}
    rmse = {k: float(np.sqrt(np.mean((p - truth) ** 2))) for k, p in predictions.items()}
    return {
        "series": series.name,
        "column": series.column,
        "horizon_min": horizon,
        "mae": mae,
        "rmse": rmse,
        "mae_ratio_lstm_persistence": mae["lstm"] / mae["persistence"]
        if mae["persistence"] > 0
        else math.nan,
        "points": len(ends),
    }


def save_checkpoint(forecaster: Forecaster, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(forecaster.config), indent=1) + "\n")
    torch.save(forecaster.model.state_dict(), out / "model.pt")
    return out


def load_checkpoint(path: str | Path) -> Forecaster:
    """A forecaster saved by ``save_checkpoint``; ``InputError`` if the folder isn't one."""
    path = Path(path)
    try:
        config = ForecasterConfig.from_json(json.loads((path / "config.json").read_text()))
        state = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        model = LoadLSTM(config)
        model.load_state_dict(state)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise InputError(f"not a forecaster checkpoint: {exc}", path=str(path)) from None
    return Forecaster(config, model)


def default_checkpoint() -> Path:
    """The checkpoint shipped in the package."""
    return Path(str(resources.files("autotune") / "data" / "forecaster"))


class EnvForecast:
    """The forecaster as the observation encoder wants it
    (``autotune.envs.spaces.ObservationEncoder``, in the environment and in the daemon):
    the busy share 15 minutes ahead from the busy share of each decision round. Rounds
    are put on real minutes whatever the round period (``minutes``), and the cluster's
    clock gives the time of day."""

    def __init__(self, forecaster: Forecaster | None = None, horizon: int = 15) -> None:
        self.forecaster = forecaster or load_checkpoint(default_checkpoint())
        self.horizon = horizon

    def __call__(self, history: Sequence[float], interval_s: float, now_s: float) -> float:
        minutes = self.minutes(history, interval_s)
        return self._predict(minutes, now_s)

    def minutes(self, history: Sequence[float], interval_s: float) -> np.ndarray:
        """The busy share per real minute, oldest first, whatever the round period:
        rounds of a minute or more are held for their minutes, shorter rounds are sampled
        once a minute (the newest round of each minute)."""
        values = np.asarray(history, dtype=np.float64)
        if interval_s >= 60:
            per_round = max(1, round(interval_s / 60))
            need = math.ceil(self.forecaster.history / per_round)
            return np.repeat(values[-need:], per_round)
        stride = max(1, round(60 / interval_s))
        return values[::-1][::stride][::-1][-self.forecaster.history :]

    def _predict(self, minutes: np.ndarray, now_s: float) -> float:
        value = self.forecaster.predict_next(minutes, (now_s / 60) % DAY_MINUTES, self.horizon)
        return float(min(1.0, max(0.0, value)))
