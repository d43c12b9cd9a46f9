"""Straggler distribution: how unevenly the workers of a synchronous job run.

Source: Alibaba PAI's GPU cluster trace v2020, ``mini-batch-time/coefficient_variation``
(CC BY 4.0): for 100 distributed jobs, the coefficient of variation (std/mean) of the
workers' mini-batch times at each iteration. A job's straggler level is the median over
its iterations; the product ships those 100 medians (``data/stragglers.json``) so that it
runs without the trace, and ``derive`` recomputes them from the file.

A synchronous step waits for the slowest of n workers: with per-worker times
N(mu, (cv*mu)^2), E[max] = mu * (1 + cv * e(n)) (``autotune.perf.model.expected_max_normal``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from autotune.errors import InputError

__all__ = ["derive", "job_cvs", "median_cv", "sample_cv"]


def derive(path: str | Path) -> list[float]:
    """Per-job median coefficient of variation from the trace's CSV (rows = jobs,
    columns = iterations, blank past a job's last iteration)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", path=str(path))
    try:
        frame = pd.read_csv(path, index_col=0)
    except Exception as exc:
        raise InputError(f"cannot read as CSV: {exc}".splitlines()[0], path=str(path)) from exc
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    out: list[float] = []
    for row, series in enumerate(values, start=2):
        finite = series[np.isfinite(series)]
        if finite.size == 0:
            raise InputError("job has no iteration values", path=str(path), row=row)
        if (finite < 0).any():
            raise InputError("negative coefficient of variation", path=str(path), row=row)
        out.append(round(float(np.median(finite)), 6))
    return out


@cache
def job_cvs() -> tuple[float, ...]:
    """The shipped per-job medians."""
    text = resources.files("autotune").joinpath("data/stragglers.json").read_text()
    return tuple(float(v) for v in json.loads(text)["job_median_cv"])


def median_cv() -> float:
    """The median job's straggler level (the noise-free model's value)."""
    return float(np.median(job_cvs()))


def sample_cv(rng: np.random.Generator) -> float:
    """One job's straggler level, drawn from the measured jobs."""
    cvs = job_cvs()
    return cvs[int(rng.integers(len(cvs)))]
