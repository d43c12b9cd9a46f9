"""The network and the forecaster around it.

``DemandLSTM``: an LSTM over the last ``window`` five-minute steps (per step: mean and
max demand relative to now, rises and falls), its last state joined with the static
features (``autotune.policies.forecast.features``), and one head per horizon giving the
arrival logit and the three quantiles of the peak's excess over demand now, in units of
the cluster's GPUs, kept in order.

``Forecaster``: a trained ``DemandLSTM`` with the arithmetic around it: features in;
arrival probabilities and the peak's quantiles in GPUs out, the quantiles shifted by the
calibration offsets chosen on the validation days (split conformal calibration). It is
an ``autotune.demand.DemandForecaster``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from autotune.policies.forecast.config import ForecasterConfig
from autotune.policies.forecast.features import F64, I64, Features, features, n_static

__all__ = ["DemandLSTM", "Forecaster"]


class DemandLSTM(nn.Module):
    """LSTM over the window, joined with the static features; per horizon one arrival
    logit and the peak's excess quantiles (share of the cluster's GPUs), in order."""

    def __init__(self, config: ForecasterConfig) -> None:
        super().__init__()
        self.config = config
        self.lstm = nn.LSTM(4, config.hidden, batch_first=True)
        width = config.hidden + n_static(config.horizons)
        self.trunk = nn.Sequential(nn.Linear(width, 2 * config.hidden), nn.GELU())
        self.heads = nn.Linear(
            2 * config.hidden, len(config.horizons) * (1 + len(config.quantiles))
        )

    def forward(
        self, window: torch.Tensor, static: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> arrival logits (n, horizons), excess quantiles (n, horizons, quantiles)."""
        out, _ = self.lstm(window)
        z = self.trunk(torch.cat([out[:, -1], static], dim=1))
        raw = self.heads(z).view(len(window), len(self.config.horizons), -1)
        first = raw[..., 1:2]
        steps = nn.functional.softplus(raw[..., 2:])
        quantiles = torch.cat([first, first + torch.cumsum(steps, dim=-1)], dim=-1)
        return raw[..., 0], quantiles


class Forecaster:
    """A trained ``DemandLSTM`` with the arithmetic around it. Runs on CPU."""

    name: str = "lstm"

    def __init__(self, config: ForecasterConfig, model: DemandLSTM | None = None) -> None:
        self.config = config
        self.model = model or DemandLSTM(config)
        self.model.eval()

    def raw(self, feats: Features, *, batch: int = 8192) -> tuple[F64, F64]:
        """Arrival probabilities (n, horizons) and excess quantiles (n, horizons, levels),
        before calibration."""
        n = len(feats.static)
        prob = np.empty((n, len(self.config.horizons)))
        excess = np.empty((n, len(self.config.horizons), len(self.config.quantiles)))
        with torch.inference_mode():
            for start in range(0, n, batch):
                sl = slice(start, start + batch)
                logit, q = self.model(
                    torch.from_numpy(feats.window[sl]), torch.from_numpy(feats.static[sl])
                )
                prob[sl] = torch.sigmoid(logit).numpy()
                excess[sl] = q.numpy()
        return prob, excess

    @property
    def history(self) -> int:
        return self.config.history

    def predict(
        self, demand: F64, capacity: float, ends: I64, week_minute: F64, origin: int = 0
    ) -> tuple[F64, F64]:
        """Arrival probabilities (n, horizons) and peak quantiles in GPUs (n, horizons,
        levels), calibrated, for forecasts made at minutes ``ends`` (the
        ``autotune.demand.DemandForecaster`` protocol)."""
        feats = features(self.config, demand, capacity, ends, week_minute, origin)
        prob, excess = self.raw(feats)
        if self.config.offsets:
            excess = excess + np.asarray(self.config.offsets)[None]
        excess = np.maximum.accumulate(excess, axis=2)
        peak = np.maximum(demand[ends][:, None, None] + excess * capacity, 0.0)
        return prob, peak
