"""The online fit (``autotune.perf.online.OnlineFit``) measured on Pollux's traces: how
well a job's coefficients, refitted from the steps it has run, predict the step times of
every placement it has not (``score_online_fit``, ``bench/online_fit.py``). The choices of the
online fit's free coefficients, prior weight and pooled prior were measured here (see
``autotune.perf.online``'s docstring)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.catalog.applications import APPLICATION_PROFILES, APPLICATIONS, coefficients
from autotune.core import JobConfig, Layout, ModelProfile
from autotune.envs.presets import POLLUX_GPU, POLLUX_INTER_NODE_GBPS
from autotune.errors import InputError
from autotune.perf.fit import mape
from autotune.perf.model import Coefficients, Shape, step_time
from autotune.perf.online import FREE, MAX_SAMPLES, PRIOR_WEIGHT, OnlineFit, StepSample
from autotune.studies.pollux.fit import AppMeasurements, load_app, load_scalability

__all__ = ["POOL", "SEQUENCE", "VARIANTS", "pooled_prior", "score_online_fit"]


SEQUENCE: Final = ("1", "4", "44")
"""The placements a scheduler gives a new job, small first: one GPU, one whole node (4
T4s), two whole nodes."""
VARIANTS: Final = ("one_batch", "all_batches")
"""At each observed placement: the median traced local batch only; every traced one."""
POOL: Final = "geomean"


def pooled_prior(coeffs: Sequence[Coefficients], *, how: str = POOL) -> Coefficients:
    """One prior from other models' coefficients: per field, the geometric mean
    (``how="geomean"``; the arithmetic mean where a value is 0) or the median."""
    if not coeffs:
        raise ValueError("pooled_prior: no coefficients")
    if how not in ("median", "geomean"):
        raise ValueError(f"pooled_prior: how must be 'median' or 'geomean', got {how!r}")
    out: dict[str, Any] = {}
    for f in fields(Coefficients):
        if f.name == "executor_reduction":  # how gradients are reduced: not averaged
            kinds = {c.executor_reduction for c in coeffs}
            if len(kinds) > 1:
                raise ValueError("pooled_prior: coefficients of different reductions")
            out[f.name] = kinds.pop()
            continue
        values = np.array([float(getattr(c, f.name)) for c in coeffs])
        if how == "median":
            out[f.name] = float(np.median(values))
        elif (values > 0).all():
            out[f.name] = float(np.exp(np.mean(np.log(values))))
        else:
            out[f.name] = float(np.mean(values))
    return Coefficients(**out)


def _samples(data: AppMeasurements, rows: Iterable[int]) -> list[StepSample]:
    """Pollux trace rows as samples: data parallelism in fp32 on T4s."""
    out = []
    for i in rows:
        ranks = data.ranks_per_node[i]
        world = sum(ranks)
        out.append(
            StepSample(
                shape=Shape(
                    gpu_model=POLLUX_GPU,
                    ranks_per_node=ranks,
                    inter_node_gbps=POLLUX_INTER_NODE_GBPS,
                ),
                config=JobConfig(layout=Layout(world_size=world)),
                global_batch=int(data.local_batch[i]) * world,
                step_s=float(data.step_time[i]),
                sync_s=float(data.sync_time[i]),
            )
        )
    return out


def _observed_rows(data: AppMeasurements, placement: tuple[int, ...], variant: str) -> list[int]:
    rows = [i for i, r in enumerate(data.ranks_per_node) if r == placement]
    if not rows:
        raise InputError(f"{data.app}: no rows at placement {''.join(map(str, placement))}")
    if variant == "all_batches":
        return rows
    rows.sort(key=lambda i: data.local_batch[i])
    return [rows[(len(rows) - 1) // 2]]


def _step_mape(profile: ModelProfile, coeffs: Coefficients, test: Sequence[StepSample]) -> float:
    predicted = [
        step_time(profile, s.config, s.shape, s.global_batch, coeffs=coeffs).step_s for s in test
    ]
    return round(mape(predicted, [s.step_s for s in test]), 4)


def _across(values: Sequence[Any]) -> dict[str, Any]:
    """Mean and median over applications, element-wise for lists."""
    array = np.array(values, dtype=float)
    return {
        "mean": np.round(array.mean(axis=0), 4).tolist(),
        "median": np.round(np.median(array, axis=0), 4).tolist(),
    }


def score_online_fit(
    directory: str | Path,
    *,
    placements: int = 3,
    apps: Sequence[str] = APPLICATIONS,
    sequence: Sequence[str] = SEQUENCE,
    prior_weight: float = PRIOR_WEIGHT,
    free: Sequence[str] = FREE,
    pool: str = POOL,
) -> dict[str, Any]:
    """Observe each application on the first ``placements`` of ``sequence`` (placement
    strings as in ``placements.csv``: replicas per node) and report the step-time MAPE on
    all its other rows (``placements.csv`` at the placements not observed, and all of
    ``scalability.csv``) after each observed placement: for both variants (one local
    batch per placement, every traced one) and both priors (``loo``: the other
    applications' shipped coefficients pooled by ``pooled_prior``, so nothing of the
    application leaks in; ``defaults``: ``Coefficients()``), beside the prior alone and
    the offline fit (the shipped coefficients, fitted on all of the application's rows,
    the test rows included: a floor, not a competitor). The test rows are the same after
    1, 2 and 3 placements. Deterministic: no randomness anywhere."""
    if not 1 <= placements <= len(sequence):
        raise InputError(f"placements must be in 1..{len(sequence)}, got {placements}")
    observed = [tuple(int(c) for c in p) for p in sequence[:placements]]
    directory = Path(directory)
    report: dict[str, Any] = {
        "sequence": list(sequence[:placements]),
        "free": list(free),
        "prior_weight": prior_weight,
        "pool": pool,
        "apps": {},
    }
    for app in apps:
        profile = APPLICATION_PROFILES[app]
        data = load_app(directory, app)
        scale = load_scalability(directory, app)
        test = _samples(data, (i for i, r in enumerate(data.ranks_per_node) if r not in observed))
        test += _samples(scale, range(len(scale.local_batch)))
        priors = {
            "loo": pooled_prior([coefficients(a) for a in APPLICATIONS if a != app], how=pool),
            "defaults": Coefficients(),
        }
        row: dict[str, Any] = {
            "n_test": len(test),
            "offline": _step_mape(profile, coefficients(app), test),
        }
        for prior_name, prior in priors.items():
            row[prior_name] = {"prior_only": _step_mape(profile, prior, test)}
            for variant in VARIANTS:
                # min_points=1: one point (one batch at one GPU) is already fitted
                online = OnlineFit(
                    profile,
                    prior,
                    min_points=1,
                    prior_weight=prior_weight,
                    max_samples=max(MAX_SAMPLES, len(data.local_batch)),
                    free=free,
                )
                after = []
                for placement in observed:
                    online.add_many(_samples(data, _observed_rows(data, placement, variant)))
                    after.append(_step_mape(profile, online.coefficients, test))
                row[prior_name][variant] = {
                    "after": after,
                    "points": online.points,
                    "fit_error": round(online.fit_error or 0.0, 4),
                    "refits": online.refits,
                    "coefficients": asdict(online.coefficients),
                }
        report["apps"][app] = row
    rows = list(report["apps"].values())
    summary: dict[str, Any] = {"offline": _across([r["offline"] for r in rows])}
    for prior_name in ("loo", "defaults"):
        summary[prior_name] = {"prior_only": _across([r[prior_name]["prior_only"] for r in rows])}
        for variant in VARIANTS:
            summary[prior_name][variant] = _across([r[prior_name][variant]["after"] for r in rows])
    report["summary"] = summary
    return report
