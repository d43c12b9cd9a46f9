"""Sia's simulator physics: how a job advances on each GPU type's measured traces.

Sia's artifact (Jayaram Subramanya et al., SOSP'23; GitHub ``siasosp23/artifacts``,
folder ``sia-simulator/``) extends Pollux's simulator to several GPU types: every
application has ``placements-<type>.csv`` and ``scalability-<type>.csv`` per type and
one set of ``validation-<batch>.csv`` shared by all. This module reproduces its
arithmetic on top of Pollux's (``autotune.studies.pollux.trace``), with Sia's
differences:

- the GPU types of its default cluster (``simulator_config.py``): ``aws`` (g4dn.12xlarge,
  4 T4), ``rtx`` (8 RTX 2080 Ti) and ``dgx-ext`` (DGX A100, 8 A100 40 GB), our catalog's
  ``T4``, ``RTX2080Ti`` and ``A100M40`` (``SIA_GPU_MODELS``);
- the batch split of a fixed global batch, ``Job.update_local_bsz`` with batch-size
  tuning off (``job.py``): the largest local batch is the placement's own
  (``Application.get_max_local_bsz``: its rows in ``placements``, else the largest of
  the ``scalability`` rows at as many nodes and replicas or more), then clamped to the
  largest measured at that many replicas and to the largest validated batch;
- a calibration to real runs: every job's goodput is divided by its application's
  ``SLOWDOWNS`` (cifar10 1.8, ncf 1.5, the others 1.2);
- the restart cost: a job pays its application's ``rescale_time`` (cifar10 50 s,
  deepspeech2 25 s, bert 120 s, yolov3 80 s, imagenet 250 s, ncf 15 s) at every start,
  restart and move (``Job.reallocate``, ``Job.migrate``);
- deepspeech2 on ``rtx`` has a largest local batch of 57 (``applications.py``; Sia's
  split with a fixed batch does not read it, nor does ours: it bounds the batches a
  job's local batch is searched over).

Progress, gradient statistics, epochs and the whole-second epoch ends are Pollux's.

The traces are read from the artifact's ``sia-simulator`` folder, which the caller names:
nothing of the artifact ships here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Final

import numpy as np

from autotune.core import JobConfig
from autotune.envs.simulator import PhysicsRound
from autotune.errors import InputError
from autotune.studies.pollux.trace import (
    POLLUX_MAX_EPOCHS,
    BatchSplit,
    TraceApp,
    read_trace_app,
)

__all__ = [
    "SIA_APPLICATIONS",
    "SIA_CLUSTER",
    "SIA_GPU_MODELS",
    "SIA_RESCALE_S",
    "SIA_SLOWDOWNS",
    "SIA_TYPE_OF",
    "SiaApp",
    "SiaTypeApp",
    "load_sia_apps",
]

SIA_GPU_MODELS: Final[Mapping[str, str]] = MappingProxyType(
    {"aws": "T4", "rtx": "RTX2080Ti", "dgx-ext": "A100M40"}
)
"""Sia's GPU types (the suffix of its trace files) -> our catalog's GPU model."""

SIA_CLUSTER: Final[Mapping[str, tuple[int, int]]] = MappingProxyType(
    {"aws": (6, 4), "rtx": (3, 8), "dgx-ext": (2, 8)}
)
"""Sia's default cluster (``simulator_config.cluster_nnodes`` and
``cluster_ngpus_per_node``): per type, (nodes, GPUs per node); 64 GPUs."""

SIA_APPLICATIONS: Final = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
"""The data-parallel applications Sia measured on every type of its default cluster."""

SIA_SLOWDOWNS: Final[Mapping[str, float]] = MappingProxyType(
    {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
)
"""``simulator_config.SLOWDOWNS``: how much slower than traced each application ran on
Sia's testbed."""

SIA_RESCALE_S: Final[Mapping[str, float]] = MappingProxyType(
    {
        "cifar10": 50.0,
        "deepspeech2": 25.0,
        "bert": 120.0,
        "yolov3": 80.0,
        "imagenet": 250.0,
        "ncf": 15.0,
    }
)
"""``Application.rescale_time``: seconds without progress at every start, restart and move
(any other application: ``DEFAULT_RESCALE_S``)."""
DEFAULT_RESCALE_S: Final = 30.0

SIA_TYPE_OF: Final[Mapping[str, str]] = MappingProxyType(
    {model: suffix for suffix, model in SIA_GPU_MODELS.items()}
)
"""Our GPU model -> Sia's name of its type (``SIA_GPU_MODELS`` reversed)."""

_MAX_LOCAL_OVERRIDE: Final[Mapping[tuple[str, str], int]] = MappingProxyType(
    {("deepspeech2", "rtx"): 57}
)
_EPS: Final = 1e-8


def rescale_s(app: str) -> float:
    """An application's restart cost in Sia's world (``SIA_RESCALE_S``)."""
    return SIA_RESCALE_S.get(app, DEFAULT_RESCALE_S)


class SiaTypeApp(TraceApp):
    """One application on one GPU type: Pollux's physics with Sia's batch split and
    slowdown (build it with ``load_sia_apps``)."""

    __slots__ = ("_by_replicas", "_max_locals", "_sia_splits")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._max_locals: dict[tuple[int, ...], int] = {}
        self._sia_splits: dict[tuple[tuple[int, ...], int, bool], BatchSplit] = {}
        by_replicas: dict[int, int] = {}
        for ranks, local in zip(self._placements.ranks, self._placements.local_bsz, strict=True):
            replicas = sum(ranks)
            by_replicas[replicas] = max(by_replicas.get(replicas, 0), int(local))
        self._by_replicas = by_replicas

    def max_local_on(self, ranks_per_node: Sequence[int]) -> int:
        """The largest local batch of the placement (``Application.get_max_local_bsz``):
        its own rows' where it was measured, else the largest measured at as many nodes
        and replicas or more."""
        placement = self._rotation(ranks_per_node)
        found = self._max_locals.get(placement)
        if found is not None:
            return found
        index = self._rows.get(placement)
        if index is not None:
            found = int(self._placements.local_bsz[index].max())
        else:
            table = self._scalability
            wider = (table["num_nodes"] >= len(placement)) & (
                table["num_replicas"] >= sum(placement)
            )
            if not np.any(wider):
                raise ValueError(
                    f"{self.name}: nothing measured at {sum(placement)} GPUs on "
                    f"{len(placement)} nodes or more"
                )
            found = int(table["local_bsz"][wider].max())
        self._max_locals[placement] = found
        return found

    def split_on(
        self, ranks_per_node: Sequence[int], batch: int, *, capped: bool = True
    ) -> BatchSplit:
        """Sia's ``update_local_bsz`` for a fixed global ``batch`` on the placement;
        ``capped=False``: without bounding the local batch by the largest measured at the
        GPU count, as Sia's ``get_throughput_with_accum`` (what its policies rank types
        by) splits it."""
        key = (tuple(ranks_per_node), batch, capped)
        found = self._sia_splits.get(key)
        if found is not None:
            return found
        gpus = sum(ranks_per_node)
        if gpus < 1 or batch < 1:
            raise ValueError(f"{self.name}: need gpus >= 1 and batch >= 1, got {gpus}, {batch}")
        local = math.ceil(batch / gpus - _EPS)
        accum = math.ceil(local / self.max_local_on(ranks_per_node) - _EPS) - 1
        if gpus == 1 and batch > self.init_batch:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - _EPS)
        measured = self._by_replicas.get(gpus)
        if measured is not None and capped:
            atomic = min(atomic, measured)
        atomic = min(atomic, int(self.max_batch / (gpus * (accum + 1))))
        found = BatchSplit(atomic=atomic, accum_steps=accum, batch=gpus * atomic * (accum + 1))
        self._sia_splits[key] = found
        return found


class SiaApp:
    """One application of Sia's world on every GPU type it was measured on: the
    simulated cluster's ``JobPhysics`` for its jobs, each step on the type the job runs
    on (``gpu_model``)."""

    def __init__(self, name: str, types: Mapping[str, SiaTypeApp]) -> None:
        if not types:
            raise ValueError(f"{name}: measured on no GPU type")
        works = {round(app.target_progress, 9) for app in types.values()}
        if len(works) != 1:
            raise ValueError(f"{name}: GPU types disagree on the work to finish: {works}")
        self.name = name
        self.types = MappingProxyType(dict(types))
        """GPU model -> the application's physics on it."""
        self._restart_s = rescale_s(name)

    def __repr__(self) -> str:
        return f"SiaApp({self.name!r}, {sorted(self.types)})"

    def on(self, gpu_model: str) -> SiaTypeApp:
        """The physics on ``gpu_model``; ``ValueError`` where it was not measured."""
        found = self.types.get(gpu_model)
        if found is None:
            raise ValueError(
                f"{self.name}: not measured on {gpu_model!r} (measured: "
                f"{', '.join(sorted(self.types))})"
            )
        return found

    def samples_per_s(self, gpu_model: str, ranks_per_node: Sequence[int], batch: int) -> float:
        """Samples per second of ``batch`` on the placement of ``gpu_model`` GPUs as the
        job trains (its effective batch over its step, with the slowdown), ``ValueError``
        where its traces have no step time."""
        app = self.on(gpu_model)
        effective, period = app._config(ranks_per_node, batch)
        return effective / period

    # --- as the simulated cluster's JobPhysics ---------------------------------------

    @property
    def work(self) -> float:
        return next(iter(self.types.values())).target_progress

    @property
    def restart_s(self) -> float:
        """The application's ``rescale_time`` (``SIA_RESCALE_S``), at every start and
        restart."""
        return self._restart_s

    def reference_rate(
        self, reference_gpus: int, gpus_per_node: int, batch: int, *, gpu_model: str
    ) -> float:
        app = self.types.get(gpu_model) or next(iter(self.types.values()))
        return app.reference_rate(reference_gpus, gpus_per_node, batch)

    def advance(
        self,
        job_id: str,
        done: float,
        config: JobConfig,
        ranks_per_node: tuple[int, ...],
        batch: int,
        run_s: float,
        *,
        gpu_model: str,
    ) -> PhysicsRound:
        return self.on(gpu_model).advance(job_id, done, config, ranks_per_node, batch, run_s)

    def in_place(self, old: JobConfig | None, new: JobConfig) -> bool:
        return new.rebatches(old)


def load_sia_apps(sia: str | Path) -> dict[str, SiaApp]:
    """The applications of Sia's default cluster (``SIA_APPLICATIONS``) found in the
    artifact's ``sia-simulator`` folder (``<sia>/traces/<app>/``), each on its three GPU
    types; a missing file or a bad cell raises ``InputError``, and so does a folder with
    none of them."""
    return dict(_load_all(Path(sia).resolve()))


@cache
def _load_all(sia: Path) -> Mapping[str, SiaApp]:
    traces = sia / "traces"
    if not traces.is_dir():
        raise InputError(
            "no traces/ folder: pass the Sia artifact's sia-simulator folder", path=str(sia)
        )
    apps: dict[str, SiaApp] = {}
    for name in SIA_APPLICATIONS:
        if not (traces / name).is_dir():
            continue
        types = {
            model: read_trace_app(
                traces / name,
                max_epochs=POLLUX_MAX_EPOCHS[name],
                suffix=f"-{suffix}",
                max_local=_MAX_LOCAL_OVERRIDE.get((name, suffix)),
                slowdown=SIA_SLOWDOWNS[name],
                kind=SiaTypeApp,
            )
            for suffix, model in SIA_GPU_MODELS.items()
        }
        apps[name] = SiaApp(name, types)
    if not apps:
        raise InputError(
            f"none of Sia's applications ({', '.join(SIA_APPLICATIONS)}) in traces/",
            path=str(traces),
        )
    return MappingProxyType(apps)
