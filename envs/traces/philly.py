"""Philly-style job list (``philly_jobs``): ``timestamp,duration,num_gpus`` and optionally
``job_id``. ``timestamp`` is either seconds (any origin) or an ISO 8601 date and time
(without an offset it is taken as UTC); the first data row decides which, and every row
must then use the same kind. ``duration`` is in seconds and positive; ``num_gpus`` an
integer >= 1. Without ``job_id`` a job is named ``philly-<i>``, ``i`` counting data rows
from 0 in file order.
"""

from __future__ import annotations

from pathlib import Path

from autotune.csvfile import floats, integers, job_ids, read_csv, seconds
from autotune.envs.traces.jobs import TraceJob, assign_model

__all__ = ["philly_jobs"]

_PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")


def philly_jobs(path: str | Path, *, seed: int = 0) -> list[TraceJob]:
    """The jobs of a Philly-style job list in submission order (file order among equal
    times); models from ``assign_model(job_id, num_gpus, seed)``."""
    path = Path(path)
    frame = read_csv(path, _PHILLY_COLUMNS)
    names = (
        job_ids(frame["job_id"].tolist(), path, "job_id")
        if "job_id" in frame.columns
        else [f"philly-{i}" for i in range(len(frame))]
    )
    submitted = seconds(frame, "timestamp", path)
    durations = floats(frame, "duration", path, positive=True)
    gpus = integers(frame, "num_gpus", path, minimum=1)
    origin = min(submitted) if submitted else 0.0
    order = sorted(range(len(frame)), key=lambda i: submitted[i])
    return [
        TraceJob(
            job_id=names[i],
            submit_s=submitted[i] - origin,
            num_gpus=gpus[i],
            duration_s=float(durations[i]),
            model=assign_model(names[i], gpus[i], seed),
            global_batch=None,
        )
        for i in order
    ]
