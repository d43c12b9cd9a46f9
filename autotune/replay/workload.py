"""The workload of logged runs: the jobs that arrived while the daemon logged, as an
export's ``workload.json``, written here (``write_workload``) and read back here
(``read_workload``); the simulated cluster plays it again
(``autotune.envs.workloads.load_workload``).

Each job keeps its spec, its arrival on the backend's clock (re-based so the first
arrival is at 0), how much it trains (samples, from the backend's replay information or
its steps x batch), the GPUs of its reference configuration (the unit of normalized
goodput), the application whose calibrated coefficients it ran with, and
``speed_factor``: what the logs measured of its speed over what the performance model
predicts for the same configurations (1 where nothing was measured). A replayed job
trains ``work / speed_factor`` samples at the model's speed, so it takes as long as the
logs say it ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.catalog.applications import APPLICATIONS
from autotune.core import JobSpec, NodeInfo
from autotune.errors import InputError
from autotune.serde import from_json, to_json

__all__ = [
    "WORKLOAD_FILE",
    "Workload",
    "WorkloadJob",
    "read_workload",
    "workload_job",
    "write_workload",
]

WORKLOAD_FILE = "workload.json"


def workload_job(
    *,
    spec: JobSpec,
    task: dict[str, Any] | None,
    submitted_s: float,
    speed_factor: float = 1.0,
) -> dict[str, Any]:
    """One job of ``workload.json`` from what the job row holds."""
    task = task or {}
    info = task.get("replay") or {}
    steps = task.get("steps")
    work = info.get("work")
    if work is None:
        if not steps:
            raise ValueError(f"job {spec.job_id}: neither its work nor its steps are known")
        work = float(steps) * spec.global_batch
    app = info.get("coeffs_app")
    if app is None and "replay" not in task and spec.model is not None:
        app = spec.model.name if spec.model.name in APPLICATIONS else None
    return {
        "spec": to_json(replace(spec, submitted_at=submitted_s)),
        "task": task.get("name"),
        "steps": steps,
        "work": float(work),
        "reference_gpus": int(info.get("reference_gpus") or spec.gpu_request()),
        "coeffs_app": app,
        "speed_factor": float(speed_factor),
    }


def write_workload(
    path: Path, *, nodes: list[NodeInfo], jobs: list[dict[str, Any]], round_s: float
) -> None:
    """Write ``workload.json`` (jobs in arrival order, times re-based to the first)."""
    jobs = sorted(jobs, key=lambda j: (j["spec"]["submitted_at"], j["spec"]["job_id"]))
    origin = jobs[0]["spec"]["submitted_at"] if jobs else 0.0
    for job in jobs:
        job["spec"]["submitted_at"] = job["spec"]["submitted_at"] - origin
    data = {"round_s": round_s, "nodes": [to_json(n) for n in nodes], "jobs": jobs}
    path.write_text(json.dumps(data, indent=1))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadJob:
    """One job of ``workload.json``."""

    spec: JobSpec
    """Its spec; ``submitted_at`` re-based so the first arrival is at 0."""
    task: str | None
    steps: int | None
    work: float
    """Samples at statistical efficiency 1 it trained (replay information, or steps x
    batch)."""
    reference_gpus: int
    coeffs_app: str | None
    """The application whose calibrated coefficients it ran with; ``None``: the
    literature defaults."""
    speed_factor: float
    """What the logs measured of its speed over what the performance model predicts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """An export's ``workload.json``: the cluster, the jobs and the round period."""

    nodes: list[NodeInfo]
    jobs: list[WorkloadJob]
    round_s: float


def read_workload(directory: str | Path) -> Workload:
    """An export's ``workload.json``; ``InputError`` naming the file when it is missing
    or malformed."""
    path = Path(directory) / WORKLOAD_FILE
    if not path.is_file():
        raise InputError(
            "no workload.json here: not an export of `autotune replay export`", path=str(directory)
        )
    try:
        data = json.loads(path.read_text())
        nodes = [from_json(NodeInfo, n) for n in data["nodes"]]
        jobs = [
            WorkloadJob(
                spec=from_json(JobSpec, job["spec"]),
                task=job.get("task"),
                steps=job.get("steps"),
                work=float(job["work"]),
                reference_gpus=int(job["reference_gpus"]),
                coeffs_app=job.get("coeffs_app") or None,
                speed_factor=float(job.get("speed_factor") or 1.0),
            )
            for job in data["jobs"]
        ]
        round_s = float(data["round_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"malformed workload: {type(exc).__name__}: {exc}", path=str(path)
        ) from None
    if not nodes:
        raise InputError("the workload has no nodes", path=str(path))
    return Workload(nodes=nodes, jobs=jobs, round_s=round_s)
