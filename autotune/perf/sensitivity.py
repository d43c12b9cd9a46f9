"""What gradient compression costs real jobs' convergence, and how that cost spreads over
jobs: fitted to the efficiencies the executor measured on real training.

The catalog prices compression alike for every job (``autotune.perf.model.
CATALOG_SENSITIVITY``). Measured on the built-in tasks (steps to plain DDP's loss at step
N under each compression, ``bench/quality_validation.py``; the medians over seeds are in
``autotune/data/sensitivity.json``), the cost differs from task to task by an order of
magnitude: one task pays nothing under top-k 1%, another trains at a third of its speed.

A task's sensitivity (``CompressionSensitivity``) is the least-squares fit of its
measured losses of progress, 1 - efficiency, to the model's two shapes: ``topk`` x
log10(1/ratio)^2 over its top-k runs and ``powersgd`` x 4/rank over its PowerSGD runs (a
run faster than dense SGD counts as no loss). Over tasks, each of the two is a share of
jobs that pay nothing plus a log-normal over those that pay (``PenaltySpread``), fitted to
the tasks' values; ``SensitivitySpread.draw`` gives one job's. The simulated cluster
draws each job's from it when asked to (``SimConfig.sensitivity``): the job trains at what
it draws while the daemon, as on a real cluster, prices it by what it knows (the catalog,
or a calibration's measurement of its task). int8 and fp8 reductions cost no task
anything measurable, and stay the catalog's constants.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.core import CompressionSensitivity, CompressionSpec
from autotune.errors import InputError

__all__ = [
    "PenaltySpread",
    "SensitivitySpread",
    "fit",
    "load",
    "measured_spread",
    "task_sensitivity",
]

PAYS_NOTHING: Final = 0.01
"""A fitted penalty below this is a task that pays nothing: the measurement's resolution.
Steps to a target on the flat of a loss curve move by a few in a hundred between runs
that train alike (gpt-char's PowerSGD at rank 2: 0.97, at ranks 1 and 4: 1.0)."""
_SINGLE_SD: Final = 1.0
"""The log-normal's spread where one task paid (natural log: a factor of e either way)."""


def task_sensitivity(efficiencies: Mapping[str, float]) -> CompressionSensitivity | None:
    """A task's sensitivity from its measured efficiencies (by ``str(CompressionSpec)``):
    each shape's least-squares penalty through the origin over the runs of that kind.
    ``None`` where it has neither top-k nor PowerSGD runs; a kind with no run gets 0."""
    topk: list[tuple[float, float]] = []
    powersgd: list[tuple[float, float]] = []
    for name, efficiency in efficiencies.items():
        spec = CompressionSpec.parse(name)
        lost = min(1.0, max(0.0, 1.0 - efficiency))
        if spec.kind == "topk":
            assert spec.ratio is not None
            topk.append((math.log10(1 / spec.ratio) ** 2, lost))
        elif spec.kind == "powersgd":
            assert spec.rank is not None
            powersgd.append((4 / spec.rank, lost))
    if not topk and not powersgd:
        return None

    def slope(points: list[tuple[float, float]]) -> float:
        scale = sum(x * x for x, _ in points)
        return sum(x * y for x, y in points) / scale if scale > 0 else 0.0

    return CompressionSensitivity(topk=slope(topk), powersgd=slope(powersgd))


@dataclass(frozen=True, slots=True)
class PenaltySpread:
    """One penalty over jobs: a share that pays nothing, the rest log-normal."""

    pays_nothing: float
    """Share of jobs whose penalty is 0."""
    log_mean: float
    """Mean of the natural log of the penalty of the jobs that pay."""
    log_sd: float

    @classmethod
    def of(cls, values: list[float]) -> PenaltySpread:
        """Fitted to the tasks' ``values`` (at least one)."""
        if not values:
            raise ValueError("no values to fit")
        paying = [math.log(v) for v in values if v >= PAYS_NOTHING]
        share = 1 - len(paying) / len(values)
        if not paying:
            return cls(pays_nothing=1.0, log_mean=math.log(PAYS_NOTHING), log_sd=0.0)
        sd = statistics.stdev(paying) if len(paying) > 1 else _SINGLE_SD
        return cls(pays_nothing=share, log_mean=statistics.fmean(paying), log_sd=sd)

    def draw(self, rng: np.random.Generator) -> float:
        if rng.random() < self.pays_nothing:
            return 0.0
        return float(math.exp(rng.normal(self.log_mean, self.log_sd)))

    def cdf(self, value: float) -> float:
        """Share of jobs whose penalty is at most ``value``."""
        if value < PAYS_NOTHING:
            return self.pays_nothing
        if self.log_sd == 0:
            paying = 1.0 if math.log(value) >= self.log_mean else 0.0
        else:
            paying = statistics.NormalDist(self.log_mean, self.log_sd).cdf(math.log(value))
        return self.pays_nothing + (1 - self.pays_nothing) * paying

    @property
    def median(self) -> float:
        """The penalty of the median job."""
        if self.pays_nothing >= 0.5:
            return 0.0
        # The median of all jobs is the paying ones' quantile (0.5 - share) / (1 - share).
        q = (0.5 - self.pays_nothing) / (1 - self.pays_nothing)
        return float(math.exp(self.log_mean + self.log_sd * statistics.NormalDist().inv_cdf(q)))


@dataclass(frozen=True, slots=True)
class SensitivitySpread:
    """Compression sensitivity over jobs (see the module)."""

    topk: PenaltySpread
    powersgd: PenaltySpread
    tasks: tuple[tuple[str, CompressionSensitivity], ...] = ()
    """The tasks' sensitivities it was fitted to."""

    def draw(self, rng: np.random.Generator) -> CompressionSensitivity:
        """One job's sensitivity."""
        return CompressionSensitivity(topk=self.topk.draw(rng), powersgd=self.powersgd.draw(rng))


def fit(measured: Mapping[str, Mapping[str, float]]) -> SensitivitySpread:
    """The spread over jobs of the tasks' sensitivities, from each task's measured
    efficiencies (task -> ``str(CompressionSpec)`` -> efficiency)."""
    tasks = [(name, task_sensitivity(found)) for name, found in sorted(measured.items())]
    known = [(name, s) for name, s in tasks if s is not None]
    if not known:
        raise InputError("no task has a top-k or PowerSGD efficiency to fit")
    return SensitivitySpread(
        topk=PenaltySpread.of([s.topk for _, s in known]),
        powersgd=PenaltySpread.of([s.powersgd for _, s in known]),
        tasks=tuple(known),
    )


def load(path: str | Path | None = None) -> tuple[SensitivitySpread, dict[str, Any]]:
    """The spread fitted to a measurement file (``bench/sensitivity.py --write`` writes
    one; default: the one autotune ships), and the file itself."""
    try:
        if path is None:
            text = resources.files("autotune").joinpath("data/sensitivity.json").read_text()
        else:
            text = Path(path).read_text()
        data = json.loads(text)
        tasks = data["tasks"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"sensitivity file {path or 'shipped'}: {exc}") from exc
    return fit({t: figures["compression_efficiency"] for t, figures in tasks.items()}), data


@cache
def measured_spread() -> SensitivitySpread:
    """The spread fitted to the measurements autotune ships."""
    return load()[0]
