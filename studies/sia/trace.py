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
from typing import Final, NamedTuple

import numpy as np

from autotune.core import JobConfig
from autotune.envs.simulator import PhysicsRound
from autotune.errors import InputError
from autotune.studies.pollux.trace import (
    POLLUX_MAX_EPOCHS,
    BatchSplit,
    FloatArray,
    TraceApp,
    read_trace_app,
    require_plain,
)

__all__ = [
    "SIA_APPLICATIONS",
    "SIA_CLUSTER",
    "SIA_GPU_MODELS",
    "SIA_RESCALE_S",
    "SIA_SLOWDOWNS",
    "SIA_TYPE_OF",
    "MixedStep",
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

    __slots__ = ("_by_replicas", "_line1", "_max_locals", "_multi", "_sia_splits")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._line1: tuple[FloatArray, FloatArray] | None = None
        self._multi: tuple[FloatArray, FloatArray] | None = None
        self._max_locals: dict[tuple[int, ...], int] = {}
        self._sia_splits: dict[tuple[tuple[int, ...], int, bool], BatchSplit] = {}
        by_replicas: dict[int, int] = {}
        for ranks, local in zip(self._placements.ranks, self._placements.local_bsz, strict=True):
            replicas = sum(ranks)
            by_replicas[replicas] = max(by_replicas.get(replicas, 0), int(local))
        self._by_replicas = by_replicas

    def compute_line(self) -> tuple[FloatArray, FloatArray]:
        """One GPU's compute time per micro-step (traced step less sync time, before the
        slowdown) at each local batch traced on one GPU, in increasing local batch
        (repeated batches averaged) up to the type's largest local batch: what a rank of
        a job across GPU types computes its share in. ``ValueError`` where nothing was
        traced on one GPU."""
        if self._line1 is not None:
            return self._line1
        index = self._rows.get((1,))
        if index is None:
            raise ValueError(f"{self.name}: nothing traced on one GPU")
        rows = self._placements
        local = rows.local_bsz[index].astype(np.float64)
        compute = rows.step_time[index] - rows.sync_time[index]
        xs = np.unique(local[local <= self.max_local])
        if not len(xs):
            raise ValueError(f"{self.name}: no local batch traced on one GPU within the limit")
        ys = np.array([compute[local == x].mean() for x in xs])
        self._line1 = (xs, ys)
        return self._line1

    def split_errors(self) -> list[float]:
        """How far the split ``SiaApp.mixed_step`` rests on is from this type's traces:
        for every multi-GPU row traced within the one-GPU traced batches,
        |one GPU's compute at the row's local batch + the row's sync - the row's step|
        over the row's step."""
        xs, ys = self.compute_line()
        rows = self._placements
        errors: list[float] = []
        for i, ranks in enumerate(rows.ranks):
            local = float(rows.local_bsz[i])
            if sum(ranks) < 2 or not xs[0] <= local <= xs[-1]:
                continue
            predicted = float(np.interp(local, xs, ys)) + float(rows.sync_time[i])
            errors.append(abs(predicted / float(rows.step_time[i]) - 1))
        return errors

    def sync_near(self, ranks_per_node: Sequence[int], atomic: int) -> float:
        """The sync time of a micro-step of ``atomic`` samples per GPU on the placement
        (several nodes), before the slowdown: as traced (``step_times``) where the traces
        hold it, else at the nearest multi-node point they hold (the least summed
        distance in log nodes, log GPUs and log local batch), since the traces of one
        type stop at its own cluster's nodes."""
        try:
            return self.step_times(ranks_per_node, atomic)[1]
        except ValueError:
            pass
        if self._multi is None:
            rows = self._placements
            table = self._scalability
            keep = [i for i, r in enumerate(rows.ranks) if len(r) > 1]
            wide = table["num_nodes"] > 1
            nodes = [len(rows.ranks[i]) for i in keep] + list(table["num_nodes"][wide])
            gpus = [sum(rows.ranks[i]) for i in keep] + list(table["num_replicas"][wide])
            local = [rows.local_bsz[i] for i in keep] + list(table["local_bsz"][wide])
            times = [rows.sync_time[i] for i in keep] + list(table["sync_time"][wide])
            points = np.log(np.array([nodes, gpus, local], dtype=np.float64).T)
            self._multi = (points, np.array(times, dtype=np.float64))
        points, sync = self._multi
        if not len(sync):
            raise ValueError(f"{self.name}: nothing traced on several nodes")
        ranks = [r for r in ranks_per_node if r]
        at = np.log(np.array([len(ranks), sum(ranks), max(atomic, 1)], dtype=np.float64))
        return float(sync[int(np.argmin(np.abs(points - at).sum(axis=1)))])

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


class MixedStep(NamedTuple):
    """A step of a job across GPU types (``SiaApp.mixed_step``)."""

    shares: tuple[tuple[str, float], ...]
    """Per GPU model: each of its ranks' local batch."""
    compute_s: float
    sync_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.sync_s


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
        self._mixed: dict[
            tuple[tuple[tuple[str, int], ...], tuple[int, ...], int], MixedStep | str
        ] = {}

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

    # --- one job across GPU types ------------------------------------------------------

    def mixed_step(
        self, parts: Sequence[tuple[str, int]], ranks_per_node: Sequence[int], batch: int
    ) -> MixedStep:
        """A data-parallel step of global ``batch`` (no accumulation) on ``parts``
        (``(GPU model, ranks)``, two models or more) spread over ``ranks_per_node``, each
        rank's share of the batch set by its type's speed. Sia measured no such job, so
        this is a model built from its per-type traces, the way the executor trains one
        (uneven per-rank batches, gradients averaged by samples):

        - **compute**: each rank computes its share in its type's one-GPU compute time at
          that local batch (``SiaTypeApp.compute_line``); the shares are those that make
          the slowest rank's time least (every rank's time at most a common T, within
          each type's traced local batches), found on the running maximum of each
          type's line so that a traced dip never earns a type a larger share; the
          compute time is the slowest rank's on its traced line;
        - **sync**: the all-reduce across the whole placement at the pace of the slowest
          of its types (each type's sync time there: ``SiaTypeApp.sync_near``);
        - the step is compute + sync, times the application's slowdown.

        ``ValueError`` where the batch is outside what the types' one-GPU traces hold
        for these ranks (below the smallest local batch on every rank, or above the
        largest: no accumulation across types). Cached per (parts, placement, batch)."""
        ranks = tuple(int(r) for r in ranks_per_node if r)
        key = (tuple(sorted(parts)), ranks, int(batch))
        found = self._mixed.get(key)
        if found is not None:
            if isinstance(found, str):
                raise ValueError(found)
            return found
        try:
            found = self._mixed_step(key[0], ranks, batch)
        except ValueError as e:
            self._mixed[key] = str(e)
            raise
        self._mixed[key] = found
        return found

    def _mixed_step(
        self, parts: tuple[tuple[str, int], ...], ranks: tuple[int, ...], batch: int
    ) -> MixedStep:
        if len(parts) < 2 or len({m for m, _ in parts}) != len(parts):
            raise ValueError(f"{self.name}: a job across GPU types has two types or more")
        if sum(n for _, n in parts) != sum(ranks) or min(n for _, n in parts) < 1:
            raise ValueError(f"{self.name}: {parts} do not add up to the ranks {ranks}")
        lines = [(self.on(m).compute_line(), n) for m, n in parts]
        low, high = self.mixed_batches(parts)
        if not low <= batch <= high:
            raise ValueError(
                f"{self.name}: batch {batch} on {parts} outside the {low}..{high} "
                "the types' one-GPU traces hold"
            )
        envelopes = [(xs, np.maximum.accumulate(ys), n) for (xs, ys), n in lines]

        def shares(t: float) -> list[float]:
            # The largest local batch each type computes within t (its envelope inverted).
            return [
                float(xs[0]) if t <= env[0] else float(np.interp(t, env, xs))
                for xs, env, _ in envelopes
            ]

        lo = min(float(env[0]) for _, env, _ in envelopes)
        hi = max(float(env[-1]) for _, env, _ in envelopes)
        for _ in range(60):  # the common time T at which the shares add up to the batch
            mid = (lo + hi) / 2
            if sum(n * b for b, (_, _, n) in zip(shares(mid), envelopes, strict=True)) < batch:
                lo = mid
            else:
                hi = mid
        local = shares(hi)
        total = sum(n * b for b, (_, _, n) in zip(local, envelopes, strict=True))
        local = [b * batch / total for b in local]  # exactly the batch, within rounding
        compute = max(
            float(np.interp(b, xs, ys)) for b, ((xs, ys), _) in zip(local, lines, strict=True)
        )
        syncs = [
            self.on(model).sync_near(ranks, max(self.on(model).min_local, round(b)))
            for (model, _), b in zip(parts, local, strict=True)
        ]
        slowdown = self.on(parts[0][0]).slowdown
        return MixedStep(
            shares=tuple((m, b) for (m, _), b in zip(parts, local, strict=True)),
            compute_s=compute * slowdown,
            sync_s=max(syncs) * slowdown,
        )

    def mixed_batches(self, parts: Sequence[tuple[str, int]]) -> tuple[int, int]:
        """The global batches ``mixed_step`` runs on ``parts``: every rank between the
        smallest and the largest local batch its type traced on one GPU."""
        lines = [(self.on(m).compute_line()[0], n) for m, n in parts]
        return (
            math.ceil(sum(n * float(xs[0]) for xs, n in lines)),
            math.floor(sum(n * float(xs[-1]) for xs, n in lines)),
        )

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
        gpu_models: tuple[tuple[str, int], ...] = (),
    ) -> PhysicsRound:
        if len(gpu_models) < 2:
            return self.on(gpu_model).advance(job_id, done, config, ranks_per_node, batch, run_s)
        require_plain(job_id, config, "a job across GPU types on Sia's traces")
        on = self.on(gpu_models[0][0])
        low, high = self.mixed_batches(gpu_models)
        # Within the validated batches, and what the types' one-GPU traces hold.
        batch = min(max(batch, on.init_batch, low), on.max_batch, high)
        return on.round_at(
            done, batch, self.mixed_step(gpu_models, ranks_per_node, batch).step_s, run_s
        )

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
