"""Loaders for the Alibaba GPU cluster trace v2023 (Weng et al., USENIX ATC 2023).

Node list: ``sn,cpu_milli,memory_mib,gpu,model``. Pod list: ``name,cpu_milli,memory_mib,
num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``;
upstream's multi-GPU resamplings carry only the first five columns, and then file order
stands for creation order and no pod has a GPU-type constraint. ``.csv`` or ``.csv.gz``.

A pod becomes a ``JobSpec`` that must stay on one node (``max_nodes=1``) and asks for
``num_gpu`` GPUs at ``gpu_milli`` each; ``gpu_spec`` (models joined by ``|``) becomes
``gpu_types``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from autotune.core import MILLI_PER_GPU, JobSpec, NodeInfo
from autotune.devices import CATALOG, node_info
from autotune.errors import InputError

__all__ = ["PodTrace", "load_nodes", "load_pods"]

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


def _read(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise InputError("file not found", path=str(path))
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    except Exception as exc:  # pandas raises many types for unreadable files
        raise InputError(f"cannot read as CSV: {exc}".splitlines()[0], path=str(path)) from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(
            f"missing column(s) {', '.join(missing)}; found {', '.join(map(str, frame.columns))}",
            path=str(path),
        )
    return frame


def _integers(frame: pd.DataFrame, column: str, path: Path, minimum: int = 0) -> list[int]:
    """A column as integers (``12.0`` accepted); the first bad cell raises ``InputError``."""
    values: list[int] = []
    for i, raw in enumerate(frame[column].tolist()):
        text = str(raw).strip()
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number != int(number):
            raise InputError(f"not an integer: {text!r}", path=str(path), row=i + 2, column=column)
        if number < minimum:
            raise InputError(
                f"must be >= {minimum}, got {text}", path=str(path), row=i + 2, column=column
            )
        values.append(int(number))
    return values


def load_nodes(path: str | Path) -> list[NodeInfo]:
    """All nodes of a node list, CPU-only ones included (they hold no GPU)."""
    path = Path(path)
    frame = _read(path, _NODE_COLUMNS)
    cpu = _integers(frame, "cpu_milli", path)
    memory = _integers(frame, "memory_mib", path)
    gpus = _integers(frame, "gpu", path)
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
    return _pods_from_frame(_read(path, _POD_COLUMNS), path, limit=limit)


def _pods_from_frame(frame: pd.DataFrame, path: Path, *, limit: int | None = None) -> PodTrace:
    """``load_pods`` on a pod list already read as strings; ``path`` names it in errors."""
    cpu = _integers(frame, "cpu_milli", path)
    memory = _integers(frame, "memory_mib", path)
    num_gpu = _integers(frame, "num_gpu", path)
    gpu_milli = _integers(frame, "gpu_milli", path)
    created = (
        _integers(frame, "creation_time", path)
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
