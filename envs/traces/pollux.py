"""Pollux workload (``pollux_workload``; Qiao et al., OSDI 2021):
``name,time,application,num_replicas,batch_size``: arrival ``time`` in seconds, one of the
six applications the Pollux artifact measured (``POLLUX_APPLICATIONS``), the replicas
and the global batch size it was submitted with. Jobs carry no duration: they run until
their work is done.
"""

from __future__ import annotations

from pathlib import Path

from autotune.catalog.applications import APPLICATIONS as POLLUX_APPLICATIONS
from autotune.csvfile import floats, integers, job_ids, read_csv
from autotune.envs.traces.jobs import TraceJob
from autotune.errors import InputError

__all__ = ["POLLUX_APPLICATIONS", "pollux_workload"]

_POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


def pollux_workload(path: str | Path, *, rebase: bool = True) -> list[TraceJob]:
    """The jobs of a Pollux workload in arrival order (file order among equal times),
    the first at 0 (``rebase=False``: at its time in the file, Pollux's clock)."""
    path = Path(path)
    frame = read_csv(path, _POLLUX_COLUMNS)
    names = job_ids(frame["name"].tolist(), path, "name")
    times = floats(frame, "time", path)
    replicas = integers(frame, "num_replicas", path, minimum=1)
    batches = integers(frame, "batch_size", path, minimum=1)
    applications = [str(raw).strip() for raw in frame["application"].tolist()]
    for i, application in enumerate(applications):
        if application not in POLLUX_APPLICATIONS:
            raise InputError(
                f"unknown application {application!r}; known: {', '.join(POLLUX_APPLICATIONS)}",
                path=str(path),
                row=i + 2,
                column="application",
            )
    origin = float(times.min()) if len(times) and rebase else 0.0
    order = sorted(range(len(frame)), key=lambda i: times[i])  # stable: file order on ties
    return [
        TraceJob(
            job_id=names[i],
            submit_s=float(times[i]) - origin,
            num_gpus=replicas[i],
            duration_s=None,
            model=applications[i],
            global_batch=batches[i],
        )
        for i in order
    ]
