"""Job traces and cluster-load series from public traces, for replaying real workloads.

Every file is CSV, ``.csv`` or ``.csv.gz``, with a header line. An error names the file,
the row (the line in the file: the header is row 1, so the first data row is row 2) and
the column, and is an ``autotune.errors.InputError``.

Alibaba GPU cluster trace v2023 pod list (``alibaba_jobs``; Weng et al., USENIX ATC 2023):
``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``, times in seconds. Each GPU pod is one job that stays on
one node (``max_nodes=1``), submitted at ``creation_time`` and lasting its lifetime in the
trace, ``deletion_time - creation_time`` (which includes any wait for a node, and covers
pods that failed or were still pending when deleted). A pod that shares a GPU
(``gpu_milli`` below 1000) becomes a 1-GPU job: replay hands out whole GPUs. ``gpu_spec``
(models joined by ``|``) becomes ``gpu_types``. CPU-only pods are skipped, and so are pods
deleted the second they were created (they never held a GPU). Upstream's multi-GPU
resampling keeps only the first five columns; without creation and deletion times it
cannot be replayed, and loading it as jobs is an error (``envs.alibaba.load_pods`` still
plans it as a snapshot).

Pollux workload (``pollux_workload``; Qiao et al., OSDI 2021):
``name,time,application,num_replicas,batch_size``: arrival ``time`` in seconds, one of the
six applications the Pollux artifact measured (``POLLUX_APPLICATIONS``), the replicas
and the global batch size it was submitted with. Jobs carry no duration: they run until
their work is done.

Philly-style job list (``philly_jobs``): ``timestamp,duration,num_gpus`` and optionally
``job_id``. ``timestamp`` is either seconds (any origin) or an ISO 8601 date and time
(without an offset it is taken as UTC); the first data row decides which, and every row
must then use the same kind. ``duration`` is in seconds and positive; ``num_gpus`` an
integer >= 1. Without ``job_id`` a job is named ``philly-<i>``, ``i`` counting data rows
from 0 in file order.

Helios per-minute cluster load (``helios_load``; Hu et al., SC'21): a ``time`` column
(date and time, increasing; gaps are kept as they are) and numeric load columns such as
``gpu_utilization`` (a fraction in [0, 1]), ``total_gpu_num``, ``running_gpu_num`` and
``pending_gpu_num``.

Jobs of the Alibaba and Philly traces name no model; ``assign_model`` picks one from the
catalog by job size (``MODEL_TIERS``), the same one for the same job and seed.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from autotune.core import JobSpec
from autotune.envs.alibaba import _POD_COLUMNS, _integers, _pods_from_frame, _read
from autotune.errors import InputError

__all__ = [
    "MODEL_TIERS",
    "POLLUX_APPLICATIONS",
    "LoadSeries",
    "TraceJob",
    "alibaba_jobs",
    "assign_model",
    "helios_load",
    "philly_jobs",
    "pollux_workload",
]

MODEL_TIERS: Final[tuple[tuple[int | None, tuple[str, ...]], ...]] = (
    (1, ("resnet-50", "bert-large", "gpt-125m")),
    (4, ("bert-large", "gpt-125m", "gpt-350m")),
    (8, ("gpt-350m", "gpt-1.3b")),
    (None, ("gpt-1.3b", "gpt-7b")),
)
"""Models a trace job without one may train, by size: ``(most GPUs, names)`` in order of
size, ``None`` for any larger job. A 1-GPU job trains a small model; 2-4 GPUs a
BERT/GPT of a few hundred million parameters; 5-8 GPUs (one node) up to 1.3 B; more
than a node up to 7 B. Every name is a key of ``autotune.models.MODEL_CATALOG``."""

POLLUX_APPLICATIONS: Final = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
"""Applications of the Pollux workloads, whose throughput the Pollux artifact measured."""

_ALIBABA_TIMES = ("creation_time", "deletion_time")
_POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
_PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One job of a trace, as submitted."""

    job_id: str
    submit_s: float
    """Seconds after the trace's first submission (the first job is at 0.0)."""
    num_gpus: int
    """GPUs the job asked for, >= 1."""
    duration_s: float | None
    """How long it ran in the trace at ``num_gpus``; ``None`` when the trace has no
    durations (Pollux jobs run until their work is done)."""
    model: str
    """A key of ``autotune.models.MODEL_CATALOG``, or a Pollux application name."""
    global_batch: int | None
    """Samples per optimizer step; ``None``: the model's default."""
    gpu_types: tuple[str, ...] | None = None
    """GPU models the job may run on (Alibaba ``gpu_spec``); ``None`` means any."""
    max_nodes: int | None = None
    """Most nodes the job may span (1 for an Alibaba pod); ``None`` means any."""

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> ValueError:
            return ValueError(f"TraceJob.{name}={getattr(self, name)!r}: {why}")

        if not isinstance(self.job_id, str) or not self.job_id:
            raise fail("job_id", "must be a non-empty string")
        if not math.isfinite(self.submit_s) or self.submit_s < 0:
            raise fail("submit_s", "must be a finite number >= 0")
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int):
            raise fail("num_gpus", "must be an integer")
        if self.num_gpus < 1:
            raise fail("num_gpus", "must be >= 1")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise fail("duration_s", "must be a finite number > 0, or None")
        if not isinstance(self.model, str) or not self.model:
            raise fail("model", "must be a non-empty string")
        if self.global_batch is not None and self.global_batch < 1:
            raise fail("global_batch", "must be >= 1, or None")
        if self.gpu_types is not None and not (self.gpu_types and all(self.gpu_types)):
            raise fail("gpu_types", "must be non-empty model names, or None")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise fail("max_nodes", "must be >= 1, or None")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LoadSeries:
    """One column of a cluster-load time series. The arrays are read-only."""

    name: str
    """The file's name without ``.csv`` and ``.gz``."""
    column: str
    minutes: npt.NDArray[np.float64]
    """Minutes since the first row."""
    values: npt.NDArray[np.float64]


def assign_model(job_id: str, num_gpus: int, seed: int) -> str:
    """A model of ``MODEL_TIERS`` for a job of ``num_gpus`` GPUs, picked by a hash of the
    seed and the job id: the same on every run and every machine."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus={num_gpus!r}: must be an integer >= 1")
    names = next(names for most, names in MODEL_TIERS if most is None or num_gpus <= most)
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=8).digest()
    return names[int.from_bytes(digest, "big") % len(names)]


def _floats(
    frame: pd.DataFrame, column: str, path: Path, *, positive: bool = False
) -> npt.NDArray[np.float64]:
    """A column as finite floats (``> 0`` if ``positive``); the first bad cell raises."""
    raw = frame[column].astype(str).str.strip()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(
            f"not a finite number: {raw.iloc[i]!r}", path=str(path), row=i + 2, column=column
        )
    if positive and (values <= 0).any():
        i = int(np.argmax(values <= 0))
        raise InputError(
            f"must be > 0, got {raw.iloc[i]}", path=str(path), row=i + 2, column=column
        )
    return values


def _job_ids(names: list[str], path: Path, column: str) -> list[str]:
    """Job ids, stripped; an empty or repeated one raises."""
    seen: dict[str, int] = {}
    ids: list[str] = []
    for i, raw in enumerate(names):
        name = str(raw).strip()
        if not name:
            raise InputError("empty job id", path=str(path), row=i + 2, column=column)
        if name in seen:
            raise InputError(
                f"job id {name!r} already on row {seen[name]}",
                path=str(path),
                row=i + 2,
                column=column,
            )
        seen[name] = i + 2
        ids.append(name)
    return ids


def _seconds(frame: pd.DataFrame, column: str, path: Path) -> list[float]:
    """Timestamps in seconds: numbers, or ISO 8601 dates and times, as the first row is."""
    cells = [str(raw).strip() for raw in frame[column].tolist()]
    if not cells:
        return []
    try:
        float(cells[0])
    except ValueError:
        pass
    else:
        return [float(x) for x in _floats(frame, column, path)]
    seconds: list[float] = []
    for i, text in enumerate(cells):
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise InputError(
                f"not an ISO 8601 date and time like row 2's: {text!r}",
                path=str(path),
                row=i + 2,
                column=column,
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds.append(moment.timestamp())
    return seconds


def alibaba_jobs(path: str | Path, *, seed: int = 0, limit: int | None = None) -> list[TraceJob]:
    """The GPU pods of an Alibaba v2023 pod list as jobs, in creation order (all, or the
    first ``limit``); models from ``assign_model(name, num_gpus, seed)``."""
    path = Path(path)
    frame = _read(path, _POD_COLUMNS)
    missing = [c for c in _ALIBABA_TIMES if c not in frame.columns]
    if missing:
        raise InputError(
            f"no {' or '.join(missing)} column: this pod list carries no pod times, so it "
            "cannot be replayed as jobs (it can still be planned as a snapshot)",
            path=str(path),
            column=missing[0],
        )
    pods = _pods_from_frame(frame, path)
    deleted = _floats(frame, "deletion_time", path)
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


def pollux_workload(path: str | Path) -> list[TraceJob]:
    """The jobs of a Pollux workload in arrival order (file order among equal times)."""
    path = Path(path)
    frame = _read(path, _POLLUX_COLUMNS)
    names = _job_ids(frame["name"].tolist(), path, "name")
    times = _floats(frame, "time", path)
    replicas = _integers(frame, "num_replicas", path, minimum=1)
    batches = _integers(frame, "batch_size", path, minimum=1)
    applications = [str(raw).strip() for raw in frame["application"].tolist()]
    for i, application in enumerate(applications):
        if application not in POLLUX_APPLICATIONS:
            raise InputError(
                f"unknown application {application!r}; known: {', '.join(POLLUX_APPLICATIONS)}",
                path=str(path),
                row=i + 2,
                column="application",
            )
    origin = float(times.min()) if len(times) else 0.0
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


def philly_jobs(path: str | Path, *, seed: int = 0) -> list[TraceJob]:
    """The jobs of a Philly-style job list in submission order (file order among equal
    times); models from ``assign_model(job_id, num_gpus, seed)``."""
    path = Path(path)
    frame = _read(path, _PHILLY_COLUMNS)
    names = (
        _job_ids(frame["job_id"].tolist(), path, "job_id")
        if "job_id" in frame.columns
        else [f"philly-{i}" for i in range(len(frame))]
    )
    submitted = _seconds(frame, "timestamp", path)
    durations = _floats(frame, "duration", path, positive=True)
    gpus = _integers(frame, "num_gpus", path, minimum=1)
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


def helios_load(path: str | Path, column: str = "gpu_utilization") -> LoadSeries:
    """One column of a Helios per-minute load file, against minutes since its first row."""
    path = Path(path)
    frame = _read(path, ("time",))
    if column not in frame.columns:
        raise InputError(
            f"no such column; available: {', '.join(map(str, frame.columns))}",
            path=str(path),
            column=column,
        )
    if frame.empty:
        raise InputError("no data rows", path=str(path))
    text = frame["time"].astype(str).str.strip()
    moments = pd.to_datetime(text, errors="coerce", format="ISO8601", utc=True)
    bad = moments.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(
            f"not a date and time: {text.iloc[i]!r}", path=str(path), row=i + 2, column="time"
        )
    elapsed = (moments - moments.iloc[0]).dt.total_seconds()
    seconds: npt.NDArray[np.float64] = np.asarray(elapsed, dtype=np.float64)
    backwards = np.diff(seconds) <= 0
    if backwards.any():
        i = int(np.argmax(backwards)) + 1
        raise InputError(
            f"time {text.iloc[i]} is not after the previous row's {text.iloc[i - 1]}",
            path=str(path),
            row=i + 2,
            column="time",
        )
    values = _floats(frame, column, path)
    if column == "gpu_utilization":
        outside = (values < 0) | (values > 1)
        if outside.any():
            i = int(np.argmax(outside))
            raise InputError(
                f"a utilization is a fraction in [0, 1], got {str(frame[column].iat[i]).strip()}",
                path=str(path),
                row=i + 2,
                column=column,
            )
    minutes = seconds / 60.0
    minutes.flags.writeable = False
    values.flags.writeable = False
    name = path.name.removesuffix(".gz").removesuffix(".csv")
    return LoadSeries(name=name, column=column, minutes=minutes, values=values)
