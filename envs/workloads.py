"""Jobs for the simulated cluster: from traces, from the Pollux workloads, or generated.

A trace job asks for a GPU count; the simulator treats it as elastic between 1 and
``ELASTIC_FACTOR`` times that count (as Pollux does for its workloads), and its work is
its measured duration at the requested count under the reference config (data
parallel, fp32, no compression). Jobs of the six measured applications (the Pollux
workloads') carry their application's measured work and calibrated coefficients
(``autotune.catalog.applications``). ``job_stream`` is the built-in stream the daemon's
simulated cluster runs on its defaults; ``load_workload`` plays the jobs of logged runs
again (an export's ``workload.json``, ``autotune.replay.workload``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import numpy as np

from autotune.catalog.applications import APPLICATIONS, coefficients, target_samples
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import ELASTIC_FACTOR, JobSpec, NodeInfo
from autotune.envs.simulator import Arrival, SimConfig
from autotune.envs.traces import TraceJob
from autotune.errors import InputError
from autotune.perf.model import DEFAULT_COEFFICIENTS, Coefficients
from autotune.replay.workload import read_workload

__all__ = [
    "ELASTIC_FACTOR",
    "MAX_GPUS",
    "STREAM_MIX",
    "job_stream",
    "jobs_from_trace",
    "load_workload",
    "pick_jobs",
    "pollux_arrivals",
    "scaled_stream",
    "synthetic_jobs",
    "task_mix",
]

MAX_GPUS: Final = 64
"""The most GPUs a trace job may take (its elastic range's cap)."""

# (model, share of arrivals, requested GPUs): small jobs dominate, as in Helios and Philly.
SYNTHETIC_MIX: Final = (
    ("resnet-50", 0.25, 1),
    ("bert-large", 0.2, 2),
    ("gpt-125m", 0.25, 2),
    ("gpt-350m", 0.2, 4),
    ("gpt-1.3b", 0.1, 8),
)

# The daemon's built-in stream: (model, share of arrivals, min GPUs, max GPUs).
STREAM_MIX: Final = (
    ("gpt-125m", 0.30, 1, 8),
    ("gpt-350m", 0.20, 1, 8),
    ("bert-large", 0.20, 1, 8),
    ("resnet-50", 0.20, 1, 4),
    ("gpt-1.3b", 0.10, 2, 16),
)
STREAM_BATCH: Final = 256


def jobs_from_trace(trace: Sequence[TraceJob]) -> list[Arrival]:
    jobs: list[Arrival] = []
    for t in trace:
        model = MODEL_CATALOG[t.model]
        if t.model in APPLICATIONS:
            coeffs = coefficients(t.model)
            work = target_samples(t.model)
        else:
            coeffs = DEFAULT_COEFFICIENTS
            work = 0.0
        max_gpus = min(MAX_GPUS, t.num_gpus * ELASTIC_FACTOR)
        spec = JobSpec(
            job_id=t.job_id,
            model=model,
            global_batch=t.global_batch or model.reference_batch,
            min_gpus=1,
            max_gpus=max_gpus,
            gpu_types=t.gpu_types,
            max_nodes=t.max_nodes,
            submitted_at=t.submit_s,
            requested_gpus=min(t.num_gpus, max_gpus),
        )
        jobs.append(
            Arrival(
                spec=spec,
                task=t.model,
                work=work,
                duration_s=t.duration_s,
                reference_gpus=min(t.num_gpus, max_gpus),
                coeffs=coeffs,
            )
        )
    return jobs


def load_workload(directory: str | Path) -> tuple[list[NodeInfo], list[Arrival], float]:
    """The nodes, the arrivals and the round period of an export's ``workload.json``. A
    job trains ``work / speed_factor`` samples at the model's speed, so it takes as long
    as the logs say it ran."""
    workload = read_workload(directory)
    arrivals = [
        Arrival(
            spec=job.spec,
            task=job.task,
            steps=job.steps,
            work=job.work / max(job.speed_factor, 1e-6),
            reference_gpus=job.reference_gpus,
            coeffs=coefficients(job.coeffs_app) if job.coeffs_app else DEFAULT_COEFFICIENTS,
        )
        for job in workload.jobs
    ]
    return workload.nodes, arrivals, workload.round_s


def pollux_arrivals(path: str | Path, jobs: str | None = None) -> list[Arrival]:
    """The jobs of a Pollux workload CSV as arrivals on the catalog's profiles of its
    applications, ``jobs`` (``"START:STOP"``, a slice of the arrival order; ``None``:
    all) re-based so the first arrives at 0."""
    from autotune.envs.traces import pollux_workload

    arrivals = pick_jobs(jobs_from_trace(pollux_workload(path)), jobs, path)
    if not arrivals:
        return arrivals
    origin = min(a.spec.submitted_at for a in arrivals)
    return [
        replace(a, spec=replace(a.spec, submitted_at=a.spec.submitted_at - origin))
        for a in arrivals
    ]


def pick_jobs(arrivals: list[Arrival], jobs: str | None, path: str | Path) -> list[Arrival]:
    """``arrivals[START:STOP]`` for ``jobs`` = ``"START:STOP"`` (either may be left out;
    ``None``: all); ``InputError`` when the range is malformed or holds no job of the
    workload at ``path``."""
    if not jobs:
        return arrivals
    start, _, stop = jobs.partition(":")
    try:
        picked = slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise InputError(f"jobs {jobs!r}: START:STOP, integers") from None
    arrivals = arrivals[picked]
    if not arrivals:
        raise InputError(f"jobs {jobs!r}: no job of the workload in that range", path=str(path))
    return arrivals


def synthetic_jobs(
    rng: np.random.Generator,
    *,
    n_jobs: int,
    mean_interarrival_s: float = 600.0,
    median_duration_s: float = 3600.0,
) -> list[Arrival]:
    """A Poisson stream of catalog models with log-normal durations (sigma 1)."""
    names = [m for m, _, _ in SYNTHETIC_MIX]
    weights = np.array([w for _, w, _ in SYNTHETIC_MIX])
    gpus = {m: g for m, _, g in SYNTHETIC_MIX}
    t = 0.0
    jobs: list[Arrival] = []
    for i in range(n_jobs):
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        model = MODEL_CATALOG[name]
        spec = JobSpec(
            job_id=f"job-{i}",
            model=model,
            global_batch=model.reference_batch,
            min_gpus=1,
            max_gpus=gpus[name] * ELASTIC_FACTOR,
            submitted_at=t,
        )
        jobs.append(
            Arrival(
                spec=spec,
                task=name,
                duration_s=float(median_duration_s * rng.lognormal(0.0, 1.0)),
                reference_gpus=gpus[name],
            )
        )
        t += float(rng.exponential(mean_interarrival_s))
    return jobs


def task_mix(
    tasks: Sequence[str], gpus: int
) -> tuple[tuple[tuple[str, float, int, int], ...], dict[str, int]]:
    """A stream mix of built-in ``tasks`` (a user's jobs), equal shares; and each task's
    batch (the executor's default for the task, else ``STREAM_BATCH``). A task is
    ``NAME`` (elastic from 1 to ``gpus`` GPUs), ``NAME:N`` (exactly N) or ``NAME:LO-HI``;
    a name given twice counts once (its first form)."""
    from autotune.catalog.tasks import BUILTIN_TASKS

    if not tasks:
        raise ValueError("a job mix needs at least one task")
    if gpus < 1:
        raise ValueError("the cluster has no GPU (or CPU for ranks)")
    found: dict[str, tuple[int, int]] = {}
    for entry in tasks:
        name, _, span = entry.partition(":")
        if name not in BUILTIN_TASKS:
            raise ValueError(f"unknown task {name!r}; built-in: {', '.join(BUILTIN_TASKS)}")
        low, high = 1, gpus
        if span:
            lo, _, hi = span.partition("-")
            try:
                low, high = int(lo), int(hi or lo)
            except ValueError:
                raise ValueError(f"task {entry!r}: GPUs as N or LO-HI, not {span!r}") from None
            if not 1 <= low <= high <= gpus:
                raise ValueError(f"task {entry!r}: GPUs must lie within 1..{gpus} (the cluster's)")
        found.setdefault(name, (low, high))
    mix = tuple((name, 1.0, low, high) for name, (low, high) in found.items())
    batches = {
        t: int(getattr(BUILTIN_TASKS[t].shape, "batch_size", 0) or STREAM_BATCH) for t, *_ in mix
    }
    return mix, batches


def job_stream(
    rng: np.random.Generator,
    *,
    mean_interarrival_s: float,
    initial_jobs: int,
    max_jobs: int | None,
    taken: Callable[[str], bool] = lambda _: False,
    mix: Sequence[tuple[str, float, int, int]] = STREAM_MIX,
    batches: Mapping[str, int] | None = None,
    coeffs: Coefficients | None = None,
    task_coeffs: Mapping[str, Coefficients] | None = None,
) -> Iterator[Arrival]:
    """The built-in stream: ``initial_jobs`` waiting at time 0, then Poisson arrivals of
    ``mix`` tasks (``STREAM_MIX``: task, share, min and max GPUs), each training for
    log-uniform 1,000-10,000 steps of its batch (``batches``, else ``STREAM_BATCH``
    samples); ids ``job-00000`` on, skipping those ``taken``. ``coeffs``: the performance
    model's coefficients of the cluster they run on (a calibrated cluster's), else the
    defaults; ``task_coeffs``: a task's own there, where the calibration fitted its
    compute (``ClusterDescription.task_coefficients``). Each task's profile is
    ``autotune.catalog.tasks.task_profile``'s: with the noise scale a calibration
    measured of it, where one did."""
    from autotune.catalog.tasks import BUILTIN_TASKS, task_profile

    for name, *_ in mix:
        if name not in BUILTIN_TASKS:
            raise ValueError(f"task {name!r}: not a built-in task")
    shares = np.array([share for _, share, _, _ in mix])
    at = 0.0
    made = 0
    number = 0
    while max_jobs is None or made < max_jobs:
        if made >= initial_jobs:
            at += float(rng.exponential(mean_interarrival_s))
        name, _, min_gpus, max_gpus = mix[int(rng.choice(len(mix), p=shares / shares.sum()))]
        batch = (batches or {}).get(name, STREAM_BATCH)
        steps = round(math.exp(rng.uniform(math.log(1e3), math.log(1e4))))
        while taken(f"job-{number:05d}"):
            number += 1  # the id belongs to a job of an earlier run
        spec = JobSpec(
            job_id=f"job-{number:05d}",
            model=task_profile(name),
            global_batch=batch,
            min_gpus=min_gpus,
            max_gpus=max_gpus,
            submitted_at=at,
        )
        number += 1
        made += 1
        yield Arrival(
            spec=spec,
            task=name,
            steps=steps,
            work=float(steps * batch),
            reference_gpus=spec.gpu_request(),
            coeffs=(task_coeffs or {}).get(name) or coeffs or DEFAULT_COEFFICIENTS,
        )


def scaled_stream(
    rng: np.random.Generator, gpus: int, *, window: int = 60, load: float = 1.0
) -> list[Arrival]:
    """The built-in stream (``job_stream``) sized for a cluster of ``gpus`` GPUs:
    ``window`` jobs per GPU of the built-in cluster's size (``SimConfig``'s nodes, 32
    GPUs; at most 8x), half of them waiting at the start, arriving at ``load`` times the
    built-in stream's rate per GPU (``SimConfig.mean_interarrival_s`` on its nodes: a job
    every 300 s on 32 GPUs)."""
    if gpus < 1 or load <= 0 or window < 1:
        raise ValueError(f"gpus={gpus}, window={window}, load={load}: must be positive")
    builtin = SimConfig()
    builtin_gpus = sum(n.gpu_count for n in builtin.nodes)
    n_jobs = round(window * min(8.0, max(1.0, gpus / builtin_gpus)))
    return list(
        job_stream(
            rng,
            mean_interarrival_s=builtin.mean_interarrival_s * builtin_gpus / gpus / load,
            initial_jobs=n_jobs // 2,
            max_jobs=n_jobs,
        )
    )
