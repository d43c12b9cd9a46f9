"""Jobs for the simulator: from traces, from the Pollux workloads, or generated.

A trace job asks for a GPU count; the simulator treats it as elastic between 1 and
``ELASTIC_FACTOR`` times that count (as Pollux does for its workloads), and its work is
its measured duration at the requested count under the reference config (data
parallel, fp32, no compression). Pollux jobs carry their application's measured work
and calibrated coefficients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.envs.simulator import Job
from autotune.envs.traces import TraceJob
from autotune.perf.model import DEFAULT_COEFFICIENTS
from autotune.perf.pollux import APPS, coefficients, max_local_batch, target_samples

__all__ = ["ELASTIC_FACTOR", "jobs_from_trace", "synthetic_jobs"]

ELASTIC_FACTOR: Final = 2
MAX_GPUS: Final = 64

# (model, share of arrivals, requested GPUs): small jobs dominate, as in Helios and Philly.
SYNTHETIC_MIX: Final = (
    ("resnet-50", 0.25, 1),
    ("bert-large", 0.2, 2),
    ("gpt-125m", 0.25, 2),
    ("gpt-350m", 0.2, 4),
    ("gpt-1.3b", 0.1, 8),
)


def jobs_from_trace(trace: Sequence[TraceJob]) -> list[Job]:
    jobs: list[Job] = []
    for t in trace:
        if t.model in APPS:
            model = MODEL_CATALOG[t.model]
            coeffs = coefficients(t.model)
            work = target_samples(t.model)
            local_cap: int | None = max_local_batch(t.model)
        else:
            model = MODEL_CATALOG[t.model]
            coeffs = DEFAULT_COEFFICIENTS
            work = 0.0
            local_cap = None
        base = t.global_batch or model.reference_batch
        jobs.append(
            Job(
                job_id=t.job_id,
                model=model,
                coeffs=coeffs,
                submit_s=t.submit_s,
                work=work,
                duration_s=t.duration_s,
                base_batch=base,
                requested_gpus=t.num_gpus,
                min_gpus=1,
                max_gpus=min(MAX_GPUS, t.num_gpus * ELASTIC_FACTOR),
                max_local_batch=local_cap,
            )
        )
    return jobs


def synthetic_jobs(
    rng: np.random.Generator,
    *,
    n_jobs: int,
    mean_interarrival_s: float = 600.0,
    median_duration_s: float = 3600.0,
) -> list[Job]:
    """A Poisson stream of catalog models with log-normal durations (sigma 1)."""
    names = [m for m, _, _ in SYNTHETIC_MIX]
    weights = np.array([w for _, w, _ in SYNTHETIC_MIX])
    gpus = {m: g for m, _, g in SYNTHETIC_MIX}
    t = 0.0
    jobs: list[Job] = []
    for i in range(n_jobs):
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        model = MODEL_CATALOG[name]
        jobs.append(
            Job(
                job_id=f"job-{i}",
                model=model,
                coeffs=DEFAULT_COEFFICIENTS,
                submit_s=t,
                work=0.0,
                duration_s=float(median_duration_s * rng.lognormal(0.0, 1.0)),
                base_batch=model.reference_batch,
                requested_gpus=gpus[name],
                min_gpus=1,
                max_gpus=gpus[name] * ELASTIC_FACTOR,
            )
        )
        t += float(rng.exponential(mean_interarrival_s))
    return jobs
