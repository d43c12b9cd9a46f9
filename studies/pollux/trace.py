"""Pollux's simulator physics: how a job advances on the measured traces.

The Pollux artifact (Qiao et al., OSDI'21; GitHub ``petuum/adaptdl``, branch
``osdi21-artifact``, commit c793c70, folder ``simulator/``) simulates its six
applications from measurements alone: no performance model. This module reproduces that
arithmetic so that our simulator can run jobs as Pollux's does:

- the batch split, ``Job.update_local_bsz`` (``simulator.py`` L64-83): the global batch
  is divided over the GPUs, with gradient accumulation above the largest traced local
  batch, and at least one accumulation step on a single GPU above the initial batch;
- step and synchronisation times, ``Application.get_throughput`` (``applications.py``
  L205-227): a linear interpolation in the local batch of ``placements.csv`` for the
  placement's smallest rotation (1-4 nodes), else a 3-D linear interpolation over the
  placements grouped by (nodes, replicas, local batch) followed by ``scalability.csv``
  (5 or more nodes, counted up to 16);
- statistical efficiency, ``get_grad_stats`` (L187-202) and ``Job.step`` (L113-131): an
  optimizer step at global batch ``b`` advances ``(var + sqr) / (var / scale + sqr)``
  progress units, ``scale = b / init_batch``, with the gradient statistics of the current
  epoch interpolated linearly between the two validated batches around ``b``;
- progress and completion, ``get_progress`` (L133-141) and ``Job.step`` (L133-157):
  epoch ``e`` ends at the smallest cumulative progress any validated batch reached after
  ``e`` epochs; each epoch crossing happens at a whole second (Python's ``round``); the
  job is complete when it crosses into epoch ``max_epochs`` (``applications.py``
  L231-238; no application has a target metric).

Traces: ``<directory>/<app>/placements.csv`` (placement, local_bsz, step_time,
sync_time), ``scalability.csv`` (num_nodes, num_replicas, local_bsz, step_time,
sync_time) and ``validation-<batch>.csv`` (progress, grad_sqr, grad_var per epoch).
The 30 s restart penalty and the 60 s scheduling rounds belong to the caller.

A ``TraceApp`` is the simulated cluster's ``JobPhysics`` (``autotune.envs.simulator``):
a job whose ``Arrival.physics`` is one advances as Pollux's simulator advances it
(``work``, ``reference_rate``, ``advance``, ``in_place``).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from autotune.core import JobConfig, PrecisionMap
from autotune.csvfile import floats, integers, read_csv
from autotune.envs.simulator import Arrival, PhysicsRound
from autotune.errors import InputError

__all__ = [
    "POLLUX_FIXED_JOBS",
    "POLLUX_MAX_EPOCHS",
    "BatchSplit",
    "TraceApp",
    "load_trace_app",
    "load_trace_apps",
    "measured_batch",
    "packed",
    "read_trace_app",
    "require_plain",
    "trace_of",
]

POLLUX_MAX_EPOCHS: Final[Mapping[str, int]] = MappingProxyType(
    {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
)
"""Epochs each application trains for (``simulator/applications.py`` L231-238)."""

POLLUX_FIXED_JOBS: Final[Mapping[str, tuple[int, int]]] = MappingProxyType({"ncf": (1, 32768)})
"""Applications Pollux's artifact does not scale, as (GPUs, global batch): under its
elastic schedulers ncf trains on one GPU at batch 32,768 (``simulator.py`` L191: its
target batch under Pollux; L332 and L350: one replica at most under Pollux and
Optimus), as every workload also asks."""

# applications.py overrides yolov3's largest local batch (its placements go up to 16).
_MAX_LOCAL_OVERRIDE: Final[Mapping[str, int]] = MappingProxyType({"yolov3": 8})
_MAX_NODES: Final = 16
"""``scalability.csv`` measured up to 16 nodes; more are looked up as 16."""
_PACKED_GPUS_PER_NODE: Final = 4
"""GPUs per node of the Pollux testbed (g4dn.12xlarge), for ``standalone_s``."""
_EPS: Final = 1e-8
"""Pollux's tolerance in its ceilings."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class BatchSplit:
    """How a global batch runs on ``gpus`` GPUs."""

    atomic: int
    """Samples per GPU per micro-step."""
    accum_steps: int
    """Extra accumulation micro-steps per optimizer step (0 = none)."""
    batch: int
    """The effective global batch: ``gpus * atomic * (accum_steps + 1)``."""


@dataclass(frozen=True, slots=True)
class _Placements:
    """``placements.csv``, one entry per row in file order."""

    ranks: list[tuple[int, ...]]
    local_bsz: npt.NDArray[np.int64]
    step_time: FloatArray
    sync_time: FloatArray


class TraceApp:
    """One application's measured physics (build it with ``load_trace_app``)."""

    __slots__ = (
        "_batches",
        "_bounds",
        "_configs",
        "_gains",
        "_grad_sqr",
        "_grad_var",
        "_interp1d",
        "_iterations",
        "_nd",
        "_placements",
        "_rotations",
        "_rows",
        "_scalability",
        "_splits",
        "_times",
        "fixed",
        "init_batch",
        "max_batch",
        "max_epochs",
        "max_local",
        "min_local",
        "name",
        "slowdown",
    )

    def __init__(
        self,
        name: str,
        *,
        max_epochs: int,
        validation: Mapping[int, tuple[FloatArray, FloatArray, FloatArray, FloatArray]],
        placements: _Placements,
        scalability: Mapping[str, npt.NDArray[Any]],
        max_local: int | None = None,
        slowdown: float = 1.0,
    ) -> None:
        """``validation`` maps each validated batch to its (progress, grad_sqr, grad_var,
        iteration) columns, one row per epoch; ``slowdown``: how much slower than traced
        the job runs (a world's calibration to real runs; 1: as traced)."""
        if not validation or not placements.ranks:
            raise ValueError(f"{name}: need validation runs and placements")
        if not slowdown > 0:
            raise ValueError(f"{name}: slowdown must be > 0, got {slowdown}")
        self.name = name
        self.slowdown = slowdown
        self.fixed: tuple[int, int] | None = POLLUX_FIXED_JOBS.get(name)
        """(GPUs, global batch) where Pollux's artifact keeps the application at one size
        (``POLLUX_FIXED_JOBS``), else ``None``: elastic."""
        self.max_epochs = max_epochs
        self._batches = sorted(validation)
        self.init_batch = self._batches[0]
        self.max_batch = self._batches[-1]
        self.min_local = int(placements.local_bsz.min())
        self.max_local = int(placements.local_bsz.max()) if max_local is None else max_local
        self._grad_sqr = {b: [float(x) for x in v[1]] for b, v in validation.items()}
        self._grad_var = {b: [float(x) for x in v[2]] for b, v in validation.items()}
        self._iterations = {b: [float(x) for x in v[3]] for b, v in validation.items()}
        self._bounds = [0.0] + [
            min(float(v[0][e - 1]) for v in validation.values()) for e in range(1, max_epochs + 1)
        ]
        self._placements = placements
        rows: dict[tuple[int, ...], list[int]] = {}
        for i, ranks in enumerate(placements.ranks):
            rows.setdefault(ranks, []).append(i)
        self._rows = {p: np.array(index) for p, index in rows.items()}
        self._scalability = dict(scalability)
        self._interp1d: dict[tuple[int, ...], Any] = {}
        self._nd: Any = None
        self._rotations: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._times: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self._gains: dict[tuple[int, int], float] = {}
        self._splits: dict[tuple[int, int], BatchSplit] = {}
        self._configs: dict[tuple[tuple[int, ...], int], tuple[int, float]] = {}

    def __repr__(self) -> str:
        return f"TraceApp({self.name!r})"

    # --- progress --------------------------------------------------------------------

    @property
    def target_progress(self) -> float:
        """The progress at which the job is complete: ``epoch_progress(max_epochs)``."""
        return self._bounds[-1]

    def epoch_progress(self, epoch: int) -> float:
        """Progress at the end of ``epoch`` epochs (0 for 0): the least any validated
        batch size needed."""
        if not 0 <= epoch <= self.max_epochs:
            raise ValueError(f"{self.name}: epoch {epoch} outside 0..{self.max_epochs}")
        return self._bounds[epoch]

    def epoch_of(self, progress: float) -> int:
        """The 0-based epoch a job at ``progress`` is in (at most ``max_epochs - 1``)."""
        if not progress >= 0.0:
            raise ValueError(f"{self.name}: progress must be >= 0, got {progress}")
        return min(bisect.bisect_right(self._bounds, progress) - 1, self.max_epochs - 1)

    # --- one configuration -----------------------------------------------------------

    def split(self, gpus: int, batch: int) -> BatchSplit:
        """Pollux's ``update_local_bsz`` for a fixed global ``batch`` on ``gpus`` GPUs."""
        key = (gpus, batch)
        found = self._splits.get(key)
        if found is not None:
            return found
        if gpus < 1 or batch < 1:
            raise ValueError(f"{self.name}: need gpus >= 1 and batch >= 1, got {gpus}, {batch}")
        local = math.ceil(batch / gpus - _EPS)
        accum = math.ceil(local / self.max_local - _EPS) - 1
        if gpus == 1 and batch > self.init_batch:
            accum = max(1, accum)  # Pollux accumulates on one GPU above the initial batch
        atomic = math.ceil(local / (accum + 1) - _EPS)
        atomic = min(atomic, int(self.max_batch / (gpus * (accum + 1))))
        found = BatchSplit(atomic=atomic, accum_steps=accum, batch=gpus * atomic * (accum + 1))
        self._splits[key] = found
        return found

    def _rotation(self, ranks_per_node: Sequence[int]) -> tuple[int, ...]:
        """The lexicographically smallest rotation of the placement, zeros dropped."""
        key = tuple(ranks_per_node)
        found = self._rotations.get(key)
        if found is not None:
            return found
        ranks = tuple(int(r) for r in key if r)
        if not ranks or min(ranks) < 0:
            raise ValueError(f"{self.name}: bad placement {key}: need ranks per node >= 0")
        found = min(ranks[i:] + ranks[:i] for i in range(len(ranks)))
        self._rotations[key] = found
        return found

    def step_times(self, ranks_per_node: Sequence[int], atomic: int) -> tuple[float, float]:
        """(step_s, sync_s) of one micro-step of ``atomic`` samples per GPU, as traced."""
        placement = self._rotation(ranks_per_node)
        key = (placement, atomic)
        found = self._times.get(key)
        if found is not None:
            return found
        index = self._rows.get(placement)
        if index is not None:
            local = self._placements.local_bsz[index]
            low, high = int(local.min()), int(local.max())
            if not low <= atomic <= high:
                raise ValueError(
                    f"{self.name}: local batch {atomic} outside the traced range "
                    f"{low}..{high} of placement {placement}"
                )
            values = self._line(placement, index)(atomic)
        else:
            nodes = min(len(placement), _MAX_NODES)
            values = self._grid()([nodes, sum(placement), atomic])[0]
        found = (float(values[0]), float(values[1]))
        if math.isnan(found[0]) or math.isnan(found[1]):
            raise ValueError(
                f"{self.name}: no step time for placement {placement} at local batch "
                f"{atomic}: outside the measured points of {sum(placement)} GPUs on "
                f"{len(placement)} nodes"
            )
        self._times[key] = found
        return found

    def _line(self, placement: tuple[int, ...], index: npt.NDArray[np.intp]) -> Any:
        from scipy.interpolate import interp1d

        line = self._interp1d.get(placement)
        if line is None:
            rows = self._placements
            columns = np.column_stack([rows.step_time[index], rows.sync_time[index]])
            line = interp1d(rows.local_bsz[index], columns, axis=0)
            self._interp1d[placement] = line
        return line

    def _grid(self) -> Any:
        """The 3-D interpolator: the same points, in the same order, as Pollux's.

        Its first lookup computes the barycentric transform of each of the ~4000
        simplices with LAPACK: milliseconds, but seconds when OpenBLAS's threads compete
        for busy cores (``OPENBLAS_NUM_THREADS=1`` avoids that)."""
        if self._nd is None:
            import pandas as pd
            from scipy.interpolate import LinearNDInterpolator

            xs, ys = ["num_nodes", "num_replicas", "local_bsz"], ["step_time", "sync_time"]
            rows = self._placements
            table = pd.DataFrame(
                {
                    "num_nodes": [len(p) for p in rows.ranks],
                    "num_replicas": [sum(p) for p in rows.ranks],
                    "local_bsz": rows.local_bsz,
                    "step_time": rows.step_time,
                    "sync_time": rows.sync_time,
                }
            )
            grouped = table.groupby(xs)[ys].mean().reset_index()
            points = pd.concat(
                [grouped[xs + ys], pd.DataFrame(self._scalability)[xs + ys]], ignore_index=True
            )
            self._nd = LinearNDInterpolator(points[xs].to_numpy(), points[ys].to_numpy())
        return self._nd

    def iterations(self, batch: int, epoch: int) -> float:
        """Optimizer steps at ``batch`` after epoch ``epoch`` (0-based row of the
        validation runs), interpolated linearly between the validated batches around it
        (``Application.get_iteration``; what Optimus's oracle knows of the remaining
        work)."""
        if not 0 <= epoch < self.max_epochs:
            raise ValueError(f"{self.name}: epoch {epoch} outside 0..{self.max_epochs - 1}")
        batch = min(max(batch, self.init_batch), self.max_batch)
        k = bisect.bisect_left(self._batches, batch)
        hi = self._batches[k]
        if hi == batch:
            return self._iterations[hi][epoch]
        lo = self._batches[k - 1]
        return (
            (batch - lo) * self._iterations[hi][epoch] + (hi - batch) * self._iterations[lo][epoch]
        ) / (hi - lo)

    def gain(self, batch: int, epoch: int) -> float:
        """Progress per optimizer step at global ``batch`` during ``epoch`` (0-based)."""
        key = (batch, epoch)
        found = self._gains.get(key)
        if found is not None:
            return found
        if not self.init_batch <= batch <= self.max_batch:
            raise ValueError(
                f"{self.name}: batch {batch} outside the validated range "
                f"{self.init_batch}..{self.max_batch}"
            )
        if not 0 <= epoch < self.max_epochs:
            raise ValueError(f"{self.name}: epoch {epoch} outside 0..{self.max_epochs - 1}")
        hi = self._batches[bisect.bisect_left(self._batches, batch)]
        lo = self._batches[bisect.bisect_right(self._batches, batch) - 1]
        if lo == hi:
            sqr, var = self._grad_sqr[lo][epoch], self._grad_var[lo][epoch]
        else:
            sqr = (
                (batch - lo) * self._grad_sqr[hi][epoch] + (hi - batch) * self._grad_sqr[lo][epoch]
            ) / (hi - lo)
            var = (
                (batch - lo) * self._grad_var[hi][epoch] + (hi - batch) * self._grad_var[lo][epoch]
            ) / (hi - lo)
        scale = batch / self.init_batch
        found = (var + sqr) / (var / scale + sqr)
        self._gains[key] = found
        return found

    def max_local_on(self, ranks_per_node: Sequence[int]) -> int:
        """The largest local batch on the placement: Pollux's is the application's
        (``max_local``); a world whose limit depends on the placement overrides this."""
        return self.max_local

    def split_on(self, ranks_per_node: Sequence[int], batch: int) -> BatchSplit:
        """How ``batch`` runs on the placement: Pollux splits by the GPU count alone
        (``split``); a world whose split depends on the placement overrides this."""
        return self.split(sum(ranks_per_node), batch)

    def _config(self, ranks_per_node: Sequence[int], batch: int) -> tuple[int, float]:
        """(effective batch, seconds per optimizer step) of ``batch`` on the placement,
        the step slowed by ``slowdown``."""
        key = (tuple(ranks_per_node), batch)
        found = self._configs.get(key)
        if found is None:
            split = self.split_on(key[0], batch)
            step, sync = self.step_times(key[0], split.atomic)
            period = (step + (step - sync) * split.accum_steps) * self.slowdown
            found = (split.batch, period)
            self._configs[key] = found
        return found

    def rate(self, ranks_per_node: Sequence[int], batch: int, epoch: int) -> float:
        """Progress per second of global ``batch`` on the placement during ``epoch``."""
        effective, period = self._config(ranks_per_node, batch)
        return self.gain(effective, epoch) / period

    # --- running ---------------------------------------------------------------------

    def run(
        self, progress: float, ranks_per_node: Sequence[int], batch: int, seconds: float
    ) -> tuple[float, float | None]:
        """Train ``seconds`` from ``progress``: (new progress, seconds into this call at
        which the job completed, or None). Each epoch runs at its own rate and ends at a
        whole second after the epoch's start (Pollux's ``Job.step``)."""
        effective, period = self._config(ranks_per_node, batch)
        return self.run_at(progress, effective, period, seconds)

    def run_at(
        self, progress: float, effective: int, period: float, seconds: float
    ) -> tuple[float, float | None]:
        """``run`` at a given effective global batch and seconds per optimizer step (a
        placement's, or one the traces do not hold directly: a job across GPU types)."""
        bounds = self._bounds
        if progress >= bounds[-1]:
            return progress, 0.0
        epoch = self.epoch_of(progress)
        gains = self._gains
        elapsed = 0
        while seconds > 0:
            gain = gains.get((effective, epoch))
            if gain is None:
                gain = self.gain(effective, epoch)
            rate = gain / period
            end = bounds[epoch + 1]
            if progress + rate * seconds < end:
                return progress + rate * seconds, None
            epoch += 1
            delta = round((end - progress) / rate)
            progress = end
            elapsed += delta
            if epoch >= self.max_epochs:
                return progress, float(elapsed)
            seconds -= delta
        return progress, None

    def standalone_s(self, gpus: int, batch: int) -> float:
        """Seconds from start to completion on a packed placement (4 GPUs per node), no
        restart penalty."""
        if gpus < 1:
            raise ValueError(f"{self.name}: need gpus >= 1, got {gpus}")
        _, finished = self.run(0.0, packed(gpus), batch, math.inf)
        assert finished is not None  # an infinite run always completes
        return finished

    # --- as the simulated cluster's JobPhysics ------------------------------------------

    @property
    def work(self) -> float:
        """Progress units to finish (``target_progress``)."""
        return self.target_progress

    @property
    def restart_s(self) -> float | None:
        """``None``: the world's restart cost (Pollux's 30 s, ``env.RESTART_S``)."""
        return None

    def reference_rate(
        self, reference_gpus: int, gpus_per_node: int, batch: int, *, gpu_model: str = ""
    ) -> float:
        """Progress units per second on the reference GPUs, packed, in the first epoch
        (the traces measured one GPU model: ``gpu_model`` is not asked)."""
        return self.rate(packed(reference_gpus, gpus_per_node), batch, 0)

    def advance(
        self,
        job_id: str,
        done: float,
        config: JobConfig,
        ranks_per_node: tuple[int, ...],
        batch: int,
        run_s: float,
        *,
        gpu_model: str = "",
        gpu_models: tuple[tuple[str, int], ...] = (),
    ) -> PhysicsRound:
        """One round from progress ``done``: the progress units per second averaged over
        the run, the step time, the samples per second, the progress reached and the
        seconds it took to finish (``None``: it did not). A job on the traces runs data
        parallel in fp32 without compression (``ValueError`` otherwise), its batch held
        within what was measured on its placement (``measured_batch``). The traces
        measured one GPU model: ``gpu_model`` and ``gpu_models`` are not asked."""
        require_plain(job_id, config, "a job on Pollux's measured physics")
        batch = measured_batch(self, ranks_per_node, batch)
        effective, step_s = self._config(ranks_per_node, batch)
        return self.round_at(done, effective, step_s, run_s)

    def round_at(self, done: float, effective: int, step_s: float, run_s: float) -> PhysicsRound:
        """``advance`` at a given effective global batch and seconds per optimizer step
        (a placement's, or one the traces do not hold directly: a job across GPU types)."""
        if run_s <= 0:
            return PhysicsRound(
                goodput=self.gain(effective, self.epoch_of(done)) / step_s,
                step_s=step_s,
                samples_per_s=effective / step_s,
                reached=done,
                finished_after_s=None,
            )
        reached, finished_after = self.run_at(done, effective, step_s, run_s)
        seconds = finished_after if finished_after is not None else run_s
        return PhysicsRound(
            goodput=(reached - done) / max(seconds, 1e-9),
            step_s=step_s,
            samples_per_s=effective / step_s,
            reached=reached,
            finished_after_s=finished_after,
        )

    def in_place(self, old: JobConfig | None, new: JobConfig) -> bool:
        """Only a new batch on the same GPUs, as Pollux's agent re-chooses a job's batch
        size in place (the artifact's ``Job.step`` re-optimises it at every epoch and
        charges its 30 s only for a new allocation)."""
        return new.rebatches(old)


def trace_of(arrival: Arrival) -> TraceApp | None:
    """The measured physics a job runs on (``Arrival.physics``), ``None`` for a job on the
    performance model."""
    physics = arrival.physics
    return physics if isinstance(physics, TraceApp) else None


def measured_batch(trace: TraceApp, ranks: tuple[int, ...], batch: int) -> int:
    """``batch`` within what the traces measured on these ranks: at most the largest
    validated batch (Pollux's bound), and where its local batch is smaller than any
    measured there, the smallest one measured (the traces hold nothing smaller)."""
    gpus = sum(ranks)
    batch = min(batch, trace.max_batch)
    local = trace.split_on(ranks, batch).atomic
    for atomic in range(local, trace.max_local_on(ranks) + 1):
        try:
            trace.step_times(ranks, atomic)
        except ValueError:
            continue
        return batch if atomic == local else max(batch, gpus * atomic)
    raise ValueError(f"{trace.name}: no measured local batch on placement {ranks}")


def require_plain(job_id: str, config: JobConfig, what: str) -> None:
    """``ValueError`` unless ``config`` is what the traces measured: data parallel in
    fp32 without gradient compression (``what``: the job, as the message names it)."""
    if (
        config.layout.world_size != config.layout.dp
        or config.compression.kind != "none"
        or config.precision != PrecisionMap.uniform("fp32")
    ):
        raise ValueError(
            f"{job_id}: {what} runs data parallel in fp32 without compression, "
            f"got {config.describe()}"
        )


def packed(gpus: int, per_node: int = _PACKED_GPUS_PER_NODE) -> tuple[int, ...]:
    """Ranks per node of ``gpus`` GPUs on the fewest nodes of ``per_node`` GPUs (6 on
    4-GPU nodes: (4, 2)), as Pollux's testbed packs a job."""
    full, rest = divmod(gpus, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


# --------------------------------------------------------------------------------------
# Reading the traces
# --------------------------------------------------------------------------------------


def _read_validation(
    path: Path, max_epochs: int
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    frame = read_csv(path, ("progress", "iteration", "grad_sqr", "grad_var"))
    if len(frame) < max_epochs:
        raise InputError(f"{len(frame)} epochs, need {max_epochs}", path=str(path))
    progress = floats(frame, "progress", path, positive=True)
    for i in range(1, len(progress)):
        if progress[i] < progress[i - 1]:
            raise InputError(
                "progress is cumulative and must not decrease",
                path=str(path),
                row=i + 2,
                column="progress",
            )
    return (
        progress,
        floats(frame, "grad_sqr", path),
        floats(frame, "grad_var", path),
        floats(frame, "iteration", path),
    )


def _read_placements(path: Path) -> _Placements:
    frame = read_csv(path, ("placement", "local_bsz", "step_time", "sync_time"))
    ranks: list[tuple[int, ...]] = []
    for i, raw in enumerate(frame["placement"].tolist()):
        text = str(raw).strip()
        if not re.fullmatch(r"[1-9]+", text):
            raise InputError(
                f"placement must be digits 1-9 (replicas per node), got {text!r}",
                path=str(path),
                row=i + 2,
                column="placement",
            )
        ranks.append(tuple(int(c) for c in text))
    if not ranks:
        raise InputError("no rows", path=str(path))
    table = _Placements(
        ranks=ranks,
        local_bsz=np.array(integers(frame, "local_bsz", path, minimum=1), dtype=np.int64),
        step_time=floats(frame, "step_time", path, positive=True),
        sync_time=floats(frame, "sync_time", path, positive=True),
    )
    first: dict[tuple[int, ...], int] = {}
    for i, placement in enumerate(ranks):
        first.setdefault(placement, i)
    for placement, count in Counter(ranks).items():
        if count < 2:
            raise InputError(
                f"placement {''.join(map(str, placement))} has one row; need two local "
                "batch sizes to interpolate",
                path=str(path),
                row=first[placement] + 2,
            )
    return table


def _read_scalability(path: Path) -> dict[str, npt.NDArray[Any]]:
    frame = read_csv(path, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
    out: dict[str, npt.NDArray[Any]] = {
        column: np.array(integers(frame, column, path, minimum=1), dtype=np.int64)
        for column in ("num_nodes", "num_replicas", "local_bsz")
    }
    for column in ("step_time", "sync_time"):
        out[column] = floats(frame, column, path, positive=True)
    return out


def load_trace_app(directory: str | Path, app: str) -> TraceApp:
    """``<directory>/<app>/``'s traces; a missing file or a bad cell raises ``InputError``."""
    folder = Path(directory) / app
    if app not in POLLUX_MAX_EPOCHS:
        raise InputError(
            f"unknown Pollux application {app!r}; known: {', '.join(sorted(POLLUX_MAX_EPOCHS))}",
            path=str(folder),
        )
    return read_trace_app(
        folder, max_epochs=POLLUX_MAX_EPOCHS[app], max_local=_MAX_LOCAL_OVERRIDE.get(app)
    )


_App = TypeVar("_App", bound="TraceApp")


def read_trace_app(
    folder: Path,
    *,
    max_epochs: int,
    suffix: str = "",
    max_local: int | None = None,
    slowdown: float = 1.0,
    kind: type[_App] = TraceApp,  # type: ignore[assignment]
) -> _App:
    """One application's traces in ``folder`` (named for it): ``validation-<batch>.csv``,
    ``placements<suffix>.csv`` and ``scalability<suffix>.csv`` (``suffix`` ``-<type>``:
    a world that measured several GPU types, as Sia's), as a ``kind``; a missing file or
    a bad cell raises ``InputError``."""
    if not folder.is_dir():
        raise InputError("trace folder not found", path=str(folder))
    validation = {
        int(m.group(1)): _read_validation(path, max_epochs)
        for path in sorted(folder.glob("validation-*.csv"))
        if (m := re.fullmatch(r"validation-(\d+)\.csv", path.name)) and int(m.group(1)) > 0
    }
    if not validation:
        raise InputError("no validation-<batch>.csv files", path=str(folder))
    return kind(
        folder.name,
        max_epochs=max_epochs,
        validation=validation,
        placements=_read_placements(folder / f"placements{suffix}.csv"),
        scalability=_read_scalability(folder / f"scalability{suffix}.csv"),
        max_local=max_local,
        slowdown=slowdown,
    )


def load_trace_apps(directory: str | Path) -> dict[str, TraceApp]:
    """All six applications of the traces folder, read once per folder."""
    return dict(_load_all(Path(directory).resolve()))


@cache
def _load_all(directory: Path) -> Mapping[str, TraceApp]:
    return MappingProxyType(
        {app: load_trace_app(directory, app) for app in sorted(POLLUX_MAX_EPOCHS)}
    )
