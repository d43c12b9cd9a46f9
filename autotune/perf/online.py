"""Online per-job fitting of the performance model (Pollux's agent idea).

Each job's coefficients (``autotune.perf.model.Coefficients``) are refitted from the job's
own measured steps, so the scheduler needs no profile in advance; a prior (the catalog's
coefficients for its model, or the literature defaults) keeps the model sensible from
the first point. ``OnlineFit`` keeps a bounded window of distinct points, one per
(shape, config, global batch), each worth the median of its latest step times, and
refits lazily: on the first read after a new point arrived (or after a point's median
moved by more than ``REFIT_DRIFT``), warm-started from the last fit.

The fit is ``autotune.perf.fit.fit_bounded`` (soft-L1 least squares) on the residuals of
``autotune.studies.pollux.fit.fit``: log predicted / measured step time and, where the backend
measures the unhidden synchronisation, log compute time (step - sync); plus one prior
residual per free coefficient, ``PRIOR_WEIGHT * (encode(value) - encode(prior))`` on the
fit's scale (log for all but ``node_sharing_exponent``). With few points the
coefficients stay near the prior and move only where the data speak; with many, the
data dominate. Two prior terms are on ratios (``_TIED``): inter-node bandwidth efficiency
to intra-node, tree latency to intra-node latency, so a job that synchronises k times
cheaper than its prior inside one node is expected to across nodes too until it has run
there.

Choices, measured on Pollux's traces (``autotune.studies.pollux.online_fit``,
``bench/online_fit.py``): each Pollux
application observed on 1 GPU, one node ("4"), two nodes ("44"); step-time MAPE on all
its other placements (1-4 nodes) and all of ``scalability.csv`` (6-16 nodes); prior: the
other five applications' shipped coefficients pooled (leave one application out). Mean
over the six applications after 3 placements, one local batch per placement / every
traced one:

- free coefficients (``FREE``): 9 of 11. The compute terms (``mfu``,
  ``compute_overhead_s``, ``batch_exponent``), the intra-node ones (``intra_latency_s``,
  ``intra_bw_efficiency``: placement "4" measures them), the inter-node ones
  (``inter_bw_efficiency``, ``tree_latency_s``, ``node_sharing_exponent``) and
  ``overlap_gamma``. With weight 0.1: the five of the brief (mfu, overhead, inter
  efficiency, tree latency, gamma) 12.1% / 11.5%; + intra efficiency 10.9% / 9.2%; + batch
  exponent (ties on) 10.4% / 9.0%; + intra latency and node sharing: 10.6% / 8.6%, and the
  defaults prior 28% / 26% instead of 41% / 38% (its node sharing of 1 is far off).
  Held at the prior: the ring's ``inter_latency_s`` (as offline: indistinguishable from
  the tree's on few nodes) and ``two_node_sync_factor`` (only placements on 2 and on 3+
  nodes tell it apart; the pooled prior, 1.5-1.7 in every application, carries it).
- ``PRIOR_WEIGHT`` = 0.1: 0.01 gives 11.3% / 7.9%, 0.05 11.0% / 8.0%, 0.1 10.6% / 8.6%,
  0.2 10.6% / 9.1%, 0.3 10.7% / 9.3%, 1.0 86% / 9.8% (three points cannot pull nine
  coefficients far enough); 0.1 weighs a coefficient a factor e from its prior like a
  10% step-time error.
- the ties: without them 11.2% / 9.6%; they matter most after 2 placements.
- pooling the other applications by geometric mean (``pooled_prior``): the median pools
  give 12.7% / 8.5% after 3 placements (better after 2).

Reference: the offline fit on all rows (test rows included) scores 6.0%. The error after
1 and 2 placements (no multi-node point yet) is the prior's on multi-node placements and
can be large: ncf's pooled prior overestimates its synchronisation tenfold.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from autotune.core import JobConfig, ModelProfile
from autotune.perf.fit import Parameter, fit_bounded, mape
from autotune.perf.model import Coefficients, Shape, StepTime, step_time

__all__ = [
    "FREE",
    "MAX_SAMPLES",
    "PRIOR_WEIGHT",
    "JobModel",
    "OnlineFit",
    "StepSample",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobModel:
    """The coefficients to predict a job with, and where they come from."""

    coefficients: Coefficients
    source: str
    """``online`` (fitted to the job's own steps) or ``catalog``."""
    points: int = 0
    fit_error: float | None = None

    def describe(self) -> str:
        if self.source == "online":
            error = "" if self.fit_error is None else f", fit error {self.fit_error:.1%}"
            return f"online fit of its own steps ({self.points} points{error})"
        return "the catalog's coefficients for its model (too few measured points yet)"


# name -> (low, high, floor): the physical bounds of each coefficient the online fit may
# move (those of ``autotune.studies.pollux.fit``'s offline fit), and the value below which its
# prior term stops counting: a latency of 1e-7 s and one of 1e-4 s are the same "none"
# to a step of milliseconds, and without a floor a prior at the lower bound would pin it.
_BOUNDS: Final[dict[str, tuple[float, float, float]]] = {
    "mfu": (1e-4, 1.0, 1e-4),
    "compute_overhead_s": (1e-6, 5.0, 1e-3),
    "batch_exponent": (0.5, 2.0, 0.5),
    "intra_latency_s": (1e-7, 0.05, 1e-4),
    "intra_bw_efficiency": (1e-4, 1.0, 1e-4),
    "inter_bw_efficiency": (1e-4, 1.0, 1e-4),
    "node_sharing_exponent": (0.0, 2.0, 0.0),
    "tree_latency_s": (1e-7, 1.0, 1e-3),
    "overlap_gamma": (1.0, 10.0, 1.0),
    "two_node_sync_factor": (0.2, 5.0, 0.2),
}
_LINEAR: Final = frozenset({"node_sharing_exponent"})
"""Fitted, and pulled to the prior, on their own scale (they may be 0); the rest on logs."""

_TIED: Final[dict[str, str]] = {
    "inter_bw_efficiency": "intra_bw_efficiency",
    "tree_latency_s": "intra_latency_s",
}
"""Inter-node terms whose prior is on their ratio to an intra-node term (where both are
free): a job that synchronises k times cheaper than its prior inside a node is expected
to do so between nodes too, until multi-node points say otherwise."""

FREE: Final = (
    "mfu",
    "compute_overhead_s",
    "batch_exponent",
    "intra_latency_s",
    "intra_bw_efficiency",
    "inter_bw_efficiency",
    "node_sharing_exponent",
    "tree_latency_s",
    "overlap_gamma",
)
"""The coefficients the online fit moves (see the module docstring for why these)."""
PRIOR_WEIGHT: Final = 0.1
"""Weight of each prior residual against the data's log-time residuals."""
MIN_POINTS: Final = 2
MAX_SAMPLES: Final = 64
"""Distinct points kept; the least recently measured goes first."""
SAMPLES_PER_POINT: Final = 64
"""Step times kept per distinct point (its value is the median of the latest ones)."""
REFIT_DRIFT: Final = 0.05
"""A point whose median step time moved by more than this share since the last fit
makes the next read refit, as a new point does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSample:
    """One measured optimizer step (or the mean of a few) of a job."""

    shape: Shape
    """Where the ranks ran (GPU model, ranks per node, inter-node GB/s)."""
    config: JobConfig
    """The layout, precision and compression it ran with."""
    global_batch: int
    step_s: float
    """Measured seconds per optimizer step."""
    sync_s: float | None = None
    """Measured synchronisation the step did not hide, where the backend measures it."""

    def __post_init__(self) -> None:
        if self.shape.world_size != self.config.world_size:
            raise ValueError(
                f"StepSample: shape has {self.shape.world_size} ranks, "
                f"config {self.config.world_size}"
            )
        if self.global_batch < 1:
            raise ValueError(f"StepSample.global_batch: must be >= 1, got {self.global_batch}")
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"StepSample.step_s: must be finite and > 0, got {self.step_s}")
        if self.sync_s is not None and not (math.isfinite(self.sync_s) and self.sync_s >= 0):
            raise ValueError(f"StepSample.sync_s: must be finite and >= 0, got {self.sync_s}")


_Key = tuple[Shape, JobConfig, int]


@dataclass(slots=True)
class _Point:
    """The samples of one (shape, config, batch): its value is their median."""

    shape: Shape
    config: JobConfig
    global_batch: int
    steps: deque[float]
    syncs: deque[float]

    @property
    def step_s(self) -> float:
        return statistics.median(self.steps)

    @property
    def sync_s(self) -> float | None:
        return statistics.median(self.syncs) if self.syncs else None


class OnlineFit:
    """One job's online fit. ``prior``: the catalog's coefficients for its model (or the
    defaults). The coefficients in ``free`` are fitted to the job's distinct measured
    points, each pulled towards its prior value with weight ``prior_weight``; the rest
    stay at the prior. Until ``min_points`` distinct points, the prior is the answer."""

    def __init__(
        self,
        profile: ModelProfile,
        prior: Coefficients,
        *,
        min_points: int = MIN_POINTS,
        prior_weight: float = PRIOR_WEIGHT,
        max_samples: int = MAX_SAMPLES,
        free: Sequence[str] = FREE,
    ) -> None:
        if min_points < 1:
            raise ValueError(f"min_points must be >= 1, got {min_points}")
        if max_samples < min_points:
            raise ValueError(f"max_samples must be >= min_points, got {max_samples}")
        if prior_weight < 0:
            raise ValueError(f"prior_weight must be >= 0, got {prior_weight}")
        unknown = [name for name in free if name not in _BOUNDS]
        if unknown:
            raise ValueError(f"cannot fit {unknown}: free coefficients are among {list(_BOUNDS)}")
        self.profile = profile
        self.prior = prior
        self.min_points = min_points
        self.prior_weight = prior_weight
        self.max_samples = max_samples
        self.free = tuple(free)
        self._points: OrderedDict[_Key, _Point] = OrderedDict()
        self._coeffs = prior
        self._fitted = False
        self._fit_error: float | None = None
        self._dirty = False
        self._fitted_steps: dict[_Key, float] = {}
        self.refits = 0
        """Fits run so far (a cost counter)."""

    # ----------------------------------------------------------------------------------

    def add(self, sample: StepSample) -> None:
        """Record one measured step. Samples of the same (shape, config, batch) are one
        point, worth the median of their latest step times; beyond ``max_samples``
        distinct points the least recently measured is dropped."""
        key: _Key = (sample.shape, sample.config, sample.global_batch)
        point = self._points.get(key)
        if point is None:
            point = _Point(
                shape=sample.shape,
                config=sample.config,
                global_batch=sample.global_batch,
                steps=deque(maxlen=SAMPLES_PER_POINT),
                syncs=deque(maxlen=SAMPLES_PER_POINT),
            )
            self._points[key] = point
            self._dirty = True
            while len(self._points) > self.max_samples:
                old, _ = self._points.popitem(last=False)
                self._fitted_steps.pop(old, None)
        else:
            self._points.move_to_end(key)
        point.steps.append(sample.step_s)
        if sample.sync_s is not None:
            point.syncs.append(sample.sync_s)
        if not self._dirty and key in self._fitted_steps:
            seen = self._fitted_steps[key]
            if abs(point.step_s - seen) > REFIT_DRIFT * seen:
                self._dirty = True

    def add_many(self, samples: Iterable[StepSample]) -> None:
        for sample in samples:
            self.add(sample)

    @property
    def points(self) -> int:
        """Distinct (shape, config, batch) points in the window."""
        return len(self._points)

    @property
    def coefficients(self) -> Coefficients:
        """The fitted coefficients (refitted on this read when a new point arrived),
        the prior until ``min_points`` distinct points."""
        return self._current()

    @property
    def fitted(self) -> bool:
        self._current()
        return self._fitted

    @property
    def fit_error(self) -> float | None:
        """In-sample MAPE of step time over the distinct points; None before a fit."""
        self._current()
        return self._fit_error

    def predict(self, config: JobConfig, shape: Shape, global_batch: int) -> StepTime:
        return step_time(self.profile, config, shape, global_batch, coeffs=self._current())

    def summary(self) -> dict[str, Any]:
        """JSON-able state: points, whether fitted, the in-sample error, the coefficients
        in use and where they come from."""
        coeffs = self._current()
        return {
            "points": self.points,
            "fitted": self._fitted,
            "fit_error": None if self._fit_error is None else round(self._fit_error, 6),
            "coefficients": {
                k: v if isinstance(v, bool) else float(v) for k, v in asdict(coeffs).items()
            },
            "source": "online" if self._fitted else "prior",
        }

    # ----------------------------------------------------------------------------------

    def _current(self) -> Coefficients:
        if len(self._points) < self.min_points:
            return self.prior
        if self._dirty or not self._fitted:
            self._refit()
        return self._coeffs

    def _encode(self, name: str, value: float) -> float:
        low, high, floor = _BOUNDS[name]
        value = min(max(float(value), low), high)
        return value if name in _LINEAR else math.log(max(value, floor))

    def _prior_term(self, name: str, values: Mapping[str, float]) -> float:
        """Distance of ``name`` from its prior on the fit's scale; for a tied inter-node
        term, of its ratio to the intra-node one from the prior's ratio."""
        term = self._encode(name, values[name]) - self._encode(name, getattr(self.prior, name))
        anchor = _TIED.get(name)
        if anchor is not None and anchor in values:
            term -= self._encode(anchor, values[anchor]) - self._encode(
                anchor, getattr(self.prior, anchor)
            )
        return term

    def _parameters(self) -> list[Parameter]:
        """The free coefficients, starting from the last fit (the prior at first)."""
        out = []
        for name in self.free:
            low, high, _ = _BOUNDS[name]
            start = min(max(float(getattr(self._coeffs, name)), low), high)
            out.append(
                Parameter(name=name, start=start, low=low, high=high, log_scale=name not in _LINEAR)
            )
        return out

    def _predict_points(
        self, points: Sequence[_Point], coeffs: Coefficients
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        steps = np.empty(len(points))
        computes = np.empty(len(points))
        for i, p in enumerate(points):
            est = step_time(self.profile, p.config, p.shape, p.global_batch, coeffs=coeffs)
            steps[i] = est.step_s
            computes[i] = est.compute_s
        return steps, computes

    def _refit(self) -> None:
        """Least squares on log step time, on log compute time (step - measured sync,
        where measured and positive) and on the prior terms, as ``pollux.fit`` does
        offline plus the prior."""
        points = list(self._points.values())
        measured = np.array([p.step_s for p in points])
        compute = np.array(
            [p.step_s - s if (s := p.sync_s) is not None else np.nan for p in points]
        )
        with_compute = np.isfinite(compute) & (compute > 0)
        log_step = np.log(measured)
        log_compute = np.log(compute[with_compute])
        weight = self.prior_weight
        free = self.free

        def residuals(values: Mapping[str, float]) -> npt.NDArray[np.float64]:
            steps, computes = self._predict_points(points, self.prior.fitted(values))
            prior = [weight * self._prior_term(name, values) for name in free]
            return np.concatenate(
                [np.log(steps) - log_step, np.log(computes[with_compute]) - log_compute, prior]
            )

        values = fit_bounded(self._parameters(), residuals) if free else {}
        self._coeffs = self.prior.fitted(values)
        steps, _ = self._predict_points(points, self._coeffs)
        self._fit_error = mape(steps, measured)
        self._fitted = True
        self._fitted_steps = {key: p.step_s for key, p in self._points.items()}
        self._dirty = False
        self.refits += 1
