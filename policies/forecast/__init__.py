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
environment's rounds). The targets (``targets``, ``rises``), the horizons and quantiles
(``HORIZONS``, ``QUANTILES``), the forecaster protocol and ``NoForecast`` are
``autotune.demand``'s: import them from there.

The package, one concept per module:

- ``features``: ``read_demand``; ``features``, what a forecast made at a minute reads
  (the LSTM's window, the static features); ``minute_of_week``.
- ``baselines``: ``Baselines`` (calibrated persistence, climatology, persistence + buffer)
  and their fit; ``Persistence``, the named fallback forecaster made of them.
- ``config``: ``ForecasterConfig``, the network's shape with the calibration and the
  baselines fitted with it (a checkpoint's ``config.json``).
- ``model``: ``DemandLSTM`` (the ``nn.Module``) and ``Forecaster``, the calibrated
  forecasts around it.
- ``training``: ``train``, the network, its calibration and the baselines fitted on
  training series.
- ``evaluation``: ``score_forecasts`` and ``pooled``, the LSTM's and the baselines' scores;
  ``predictions_frame``, every forecast made on a series.
- ``checkpoint``: ``save_checkpoint``, ``load_checkpoint``, the shipped checkpoint
  (``default_checkpoint``, ``TRAIN_SERIES``) and ``demand_forecaster`` (one of
  ``FORECASTS``).

The package exports the names listed above but ``features``, which is imported from its
module (``autotune.policies.forecast.features``): here it would hide that module.
"""

from autotune.policies.forecast.baselines import Baselines, Persistence
from autotune.policies.forecast.checkpoint import (
    FORECASTS,
    TRAIN_SERIES,
    default_checkpoint,
    demand_forecaster,
    load_checkpoint,
    save_checkpoint,
)
from autotune.policies.forecast.config import ForecasterConfig
from autotune.policies.forecast.evaluation import pooled, predictions_frame, score_forecasts
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
    "load_checkpoint",
    "minute_of_week",
    "pooled",
    "predictions_frame",
    "read_demand",
    "save_checkpoint",
    "score_forecasts",
    "train",
]
