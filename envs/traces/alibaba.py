"""Loaders for the Alibaba GPU cluster trace v2023 (Weng et al., USENIX ATC 2023).

Node list: ``sn,cpu_milli,memory_mib,gpu,model``. Pod list: ``name,cpu_milli,memory_mib,
num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``;
upstream's multi-GPU resamplings carry only the first five columns, and then file order
stands for creation order and no pod has a GPU-type constraint. ``.csv`` or ``.csv.gz``.

A pod becomes a ``JobSpec`` that must stay on one node (``max_nodes=1``) and asks for
``num_gpu`` GPUs at ``gpu_milli`` each; ``gpu_spec`` (models joined by ``|``) becomes
``gpu_types``.

As jobs to replay (``alibaba_jobs``), a pod list needs its times (in seconds). Each GPU
pod is one job that stays on one node, submitted at ``creation_time`` and lasting its
lifetime in the trace, ``deletion_time - creation_time`` (which includes any wait for a
node, and covers pods that failed or were still pending when deleted). A pod that shares
a GPU (``gpu_milli`` below 1000) becomes a 1-GPU job: replay hands out whole GPUs. CPU-
only pods are skipped, and so are pods deleted the second they were created (they never
held a GPU). A resampling without creation and deletion times cannot be replayed:
loading it as jobs is an error (``load_pods`` still plans it as a snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from autotune.catalog.devices import CATALOG, node_info
from autotune.core import MILLI_PER_GPU, JobSpec, NodeInfo
from autotune.csvfile import floats, integers, read_csv
from autotune.envs.traces.jobs import TraceJob, assign_model
from autotune.errors import InputError

__all__ = ["PodTrace", "alibaba_jobs", "load_nodes", "load_pods"]

_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True, slots=True, kw_only=True)
class PodTrace:
    jobs: list[JobSpec]
    """GPU pods in creation order."""
    skipped_cpu_only: int
    """Pods that ask for no GPU."""
    rows: list[int] = field(default_factory=list)
    """File line of each job's pod (the header is line 1), parallel to ``jobs``."""


_ALIBABA_TIMES = ("creation_time", "deletion_time")


def load_nodes(path: str | Path) -> list[NodeInfo]:
    """All nodes of a node list, CPU-only ones included (they hold no GPU)."""
    path = Path(path)
    frame = read_csv(path, _NODE_COLUMNS)
    cpu = integers(frame, "cpu_milli", path)
    memory = integers(frame, "memory_mib", path)
    gpus = integers(frame, "gpu", path)
    nodes: list[NodeInfo] = []
    seen: set[str] = set()
    for i, (sn, model) in enumerate(zip(frame["sn"], frame["model"], strict=True)):
        row = i + 2
        model = str(model).strip()
        if gpus[i] > 0 and model not in CATALOG:
            raise InputError(
                f"unknown GPU model {model!r}; known: {', '.join(CATALOG)}",
                path=str(path),
                row=row,
                column="model",
            )
        if sn in seen:
            raise InputError(f"node {sn!r} listed twice", path=str(path), row=row, column="sn")
        seen.add(sn)
        try:
            nodes.append(
                node_info(
                    str(sn),
                    gpu_model=model,
                    gpu_count=gpus[i],
                    cpu_milli=cpu[i],
                    memory_mib=memory[i],
                )
            )
        except ValueError as exc:
            raise InputError(str(exc), path=str(path), row=row) from exc
    return nodes


def load_pods(path: str | Path, *, limit: int | None = None) -> PodTrace:
    """GPU pods in creation order (all, or the first ``limit``)."""
    path = Path(path)
    return _pods_from_frame(read_csv(path, _POD_COLUMNS), path, limit=limit)


def _pods_from_frame(frame: pd.DataFrame, path: Path, *, limit: int | None = None) -> PodTrace:
    """``load_pods`` on a pod list already read as strings; ``path`` names it in errors."""
    cpu = integers(frame, "cpu_milli", path)
    memory = integers(frame, "memory_mib", path)
    num_gpu = integers(frame, "num_gpu", path)
    gpu_milli = integers(frame, "gpu_milli", path)
    created = (
        integers(frame, "creation_time", path)
        if "creation_time" in frame.columns
        else list(range(len(frame)))
    )
    names = frame["name"].tolist()
    specs = frame["gpu_spec"].tolist() if "gpu_spec" in frame.columns else [""] * len(frame)
    rows = sorted(range(len(frame)), key=lambda i: created[i])  # stable: file order on ties
    jobs: list[JobSpec] = []
    job_rows: list[int] = []
    skipped = 0
    for i in rows:
        if num_gpu[i] == 0:
            skipped += 1
            continue
        if limit is not None and len(jobs) >= limit:
            continue
        row = i + 2
        milli = gpu_milli[i]
        if not 1 <= milli <= MILLI_PER_GPU:
            raise InputError(
                f"a GPU pod needs 1-1000 milli-GPU, got {milli}",
                path=str(path),
                row=row,
                column="gpu_milli",
            )
        spec = str(specs[i]).strip()
        try:
            jobs.append(
                JobSpec(
                    job_id=str(names[i]),
                    min_gpus=num_gpu[i],
                    max_gpus=num_gpu[i],
                    gpu_milli=milli,
                    gpu_types=tuple(spec.split("|")) if spec else None,
                    max_nodes=1,
                    cpu_milli=cpu[i],
                    memory_mib=memory[i],
                    submitted_at=float(created[i]),
                )
            )
        except ValueError as exc:
            raise InputError(str(exc), path=str(path), row=row) from exc
        job_rows.append(row)
    return PodTrace(jobs=jobs, skipped_cpu_only=skipped, rows=job_rows)


def alibaba_jobs(path: str | Path, *, seed: int = 0, limit: int | None = None) -> list[TraceJob]:
    """The GPU pods of an Alibaba v2023 pod list as jobs, in creation order (all, or the
    first ``limit``); models from ``assign_model(name, num_gpus, seed)``."""
    path = Path(path)
    frame = read_csv(path, _POD_COLUMNS)
    missing = [c for c in _ALIBABA_TIMES if c not in frame.columns]
    if missing:
        raise InputError(
            f"no {' or '.join(missing)} column: this pod list carries no pod times, so it "
            "cannot be replayed as jobs (it can still be planned as a snapshot)",
            path=str(path),
            column=missing[0],
        )
    pods = _pods_from_frame(frame, path)
    deleted = floats(frame, "deletion_time", path)
    kept: list[tuple[JobSpec, float]] = []
    for pod, row in zip(pods.jobs, pods.rows, strict=True):
        if limit is not None and len(kept) >= limit:
            break
        lifetime = float(deleted[row - 2]) - pod.submitted_at
        if lifetime < 0:
            raise InputError(
                f"deletion_time {str(frame['deletion_time'].iat[row - 2]).strip()} is before "
                f"creation_time {pod.submitted_at:.0f}",
                path=str(path),
                row=row,
                column="deletion_time",
            )
        if lifetime > 0:  # a pod deleted as it was created never held a GPU
            kept.append((pod, lifetime))
    origin = kept[0][0].submitted_at if kept else 0.0
    return [
        TraceJob(
            job_id=pod.job_id,
            submit_s=pod.submitted_at - origin,
            num_gpus=pod.min_gpus,
            duration_s=lifetime,
            model=assign_model(pod.job_id, pod.min_gpus, seed),
            global_batch=None,
            gpu_types=pod.gpu_types,
            max_nodes=1,
        )
        for pod, lifetime in kept
    ]
