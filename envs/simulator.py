"""Discrete-time cluster simulator: jobs arrive, queue, run under a config and finish.

The physics is ``autotune.perf.model``: a running job progresses at its goodput
(samples/s x statistical efficiency) and finishes when it has done its work, counted in
samples at statistical efficiency 1. Every decision round (``advance``), each job may
get a new config (``Choice``); changing it costs a restart (checkpoint, tear down,
restore). Randomness, all from the generator passed in: straggler levels per job (the
measured Alibaba distribution) and divergence events of low-precision maps (Poisson at
``autotune.perf.model.divergence_rate_per_hour``).

Jobs are admitted in queue order (FIFO by submission, or least attained service for
Tiresias) when the GPUs their config asks for are free: strict ordering, so job
completion time (JCT) includes queueing. A job gets GPUs of one model, packed onto as
few nodes as possible, fastest GPU model first: a fast stand-in for the Planner's
matching, which the daemon uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

import numpy as np

from autotune.catalog.devices import device
from autotune.core import CompressionSpec, JobConfig, Layout, ModelProfile, NodeInfo, PrecisionMap
from autotune.perf.model import Coefficients, Estimate, Shape, estimate
from autotune.perf.stragglers import median_cv, sample_cv

__all__ = [
    "BATCH_SCALES",
    "COMPRESSIONS",
    "GPU_OPTIONS",
    "LAYOUT_MODES",
    "PRECISIONS",
    "Choice",
    "ClusterSimulator",
    "Job",
    "RoundOutcome",
    "SimConfig",
    "job_config",
]

COMPRESSIONS: Final = (
    CompressionSpec(),
    CompressionSpec(kind="topk", ratio=0.1),
    CompressionSpec(kind="topk", ratio=0.01),
    CompressionSpec(kind="int8"),
    CompressionSpec(kind="fp8"),
    CompressionSpec(kind="powersgd", rank=4),
)
PRECISIONS: Final = (
    PrecisionMap.uniform("fp32"),
    PrecisionMap.uniform("bf16"),
    PrecisionMap.uniform("fp16"),
    PrecisionMap.uniform("fp8"),
)
GPU_OPTIONS: Final = (1, 2, 4, 8, 16, 32, 64)
LAYOUT_MODES: Final = ("dp", "dp x tp2", "dp x pp2")
BATCH_SCALES: Final = (0.5, 1.0, 2.0, 4.0)
N_LAYOUTS: Final = len(GPU_OPTIONS) * len(LAYOUT_MODES)
# Tiresias' queue threshold: jobs past one GPU-hour of service drop to the low queue
# (the paper's 2-queue setting tunes it per trace; one GPU-hour is its order).
LAS_THRESHOLD_GPU_S: Final = 3600.0
MAX_ACCUMULATION: Final = 64


@dataclass(frozen=True, slots=True)
class Choice:
    """Indices into the tables above: what a policy picks for one job."""

    compression: int = 0
    precision: int = 0
    layout: int = 0
    """gpus_index * len(LAYOUT_MODES) + mode_index."""
    batch: int = 1

    @staticmethod
    def for_gpus(gpus: int, mode: int = 0, **rest: int) -> Choice:
        """The layout index nearest to ``gpus`` GPUs (rounded down to a power of two)."""
        index = max(i for i, g in enumerate(GPU_OPTIONS) if g <= max(1, gpus))
        return Choice(layout=index * len(LAYOUT_MODES) + mode, **rest)


@dataclass(slots=True, kw_only=True)
class Job:
    job_id: str
    model: ModelProfile
    coeffs: Coefficients
    submit_s: float
    work: float
    """Samples at statistical efficiency 1 to finish; 0: ``duration_s`` at the reference
    config (a trace job's measured runtime)."""
    duration_s: float | None = None
    base_batch: int
    requested_gpus: int
    min_gpus: int
    max_gpus: int
    max_local_batch: int | None = None
    straggler_cv: float = 0.0
    choice: Choice | None = None
    gpus: int = 0
    gpu_model: str = ""
    ranks_per_node: tuple[int, ...] = ()
    allocation: dict[int, int] = field(default_factory=dict)
    """node index -> GPUs held."""
    progress: float = 0.0
    attained_gpu_s: float = 0.0
    start_s: float | None = None
    finish_s: float | None = None
    downtime_s: float = 0.0
    """Restart time still to serve before the job makes progress again."""
    last_goodput: float = 0.0
    last_samples_per_s: float = 0.0
    reference_goodput: float = 1.0
    """Goodput of the requested GPUs, data parallel, fp32, reference batch: the unit of
    normalized goodput."""
    oom: bool = False
    failed: bool = False
    """Its config ran out of memory: the job crashed and left the cluster."""
    nan_events: int = 0

    @property
    def running(self) -> bool:
        return self.gpus > 0 and self.finish_s is None

    @property
    def done(self) -> bool:
        return self.finish_s is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    interval_s: float = 300.0
    restart_s: float = 30.0
    """Checkpoint, tear-down and restore of a job whose config changes (seconds)."""
    queue_order: Literal["fifo", "las"] = "fifo"
    noise: bool = True
    """Sample stragglers and divergence; ``False``: the expected values (the oracle's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundOutcome:
    normalized_goodput: float
    """Sum over running jobs of goodput / reference goodput, averaged over the round."""
    ooms: int
    nan_events: int
    restarts: int
    energy_kwh: float
    finished: int
    busy_gpus: int


def job_config(job: Job, choice: Choice) -> tuple[JobConfig, int]:
    """The JobConfig and global batch that ``choice`` means for ``job``, clipped to what
    the job allows: GPUs within its min/max, a tensor/pipeline degree only when the GPU
    count and the model allow it."""
    gpus_index, mode = divmod(choice.layout % N_LAYOUTS, len(LAYOUT_MODES))
    gpus = min(max(GPU_OPTIONS[gpus_index], job.min_gpus), job.max_gpus)
    tp = pp = 1
    if mode == 1 and gpus % 2 == 0 and job.model.hidden_size:
        tp = 2
    elif mode == 2 and gpus % 2 == 0 and job.model.num_layers >= 2:
        pp = 2
    dp = gpus // (tp * pp)
    batch = max(dp, int(job.base_batch * BATCH_SCALES[choice.batch % len(BATCH_SCALES)]))
    if job.max_local_batch is not None:
        batch = min(batch, job.max_local_batch * dp)
    micro = 4 if pp > 1 else 1
    layout = Layout(world_size=gpus, dp=dp, tp=tp, pp=pp, micro_batches=micro)
    config = JobConfig(
        layout=layout,
        precision=PRECISIONS[choice.precision % len(PRECISIONS)],
        compression=COMPRESSIONS[choice.compression % len(COMPRESSIONS)],
    )
    return config, batch


class ClusterSimulator:
    """The cluster's state and its dynamics; see the module docstring."""

    def __init__(
        self,
        nodes: Sequence[NodeInfo],
        jobs: Sequence[Job],
        *,
        config: SimConfig = SimConfig(),
        rng: np.random.Generator,
    ) -> None:
        self.nodes = [n for n in nodes if n.gpu_count > 0]
        if not self.nodes:
            raise ValueError("the cluster has no GPU node")
        self.config = config
        self.rng = rng
        self.free = [n.gpu_count for n in self.nodes]
        order = sorted(  # fastest first; the name breaks ties (a set's order is not fixed)
            {n.gpu_model for n in self.nodes},
            key=lambda m: (-device(m).peak_tflops.get("bf16", device(m).peak_tflops["fp32"]), m),
        )
        self.gpu_models: tuple[str, ...] = tuple(order)
        self.total_gpus = sum(n.gpu_count for n in self.nodes)
        self.reference_gpu = max(
            self.gpu_models,
            key=lambda m: sum(n.gpu_count for n in self.nodes if n.gpu_model == m),
        )
        # A job runs on GPUs of one model: it can use at most the largest such pool.
        pool = max(
            sum(n.gpu_count for n in self.nodes if n.gpu_model == m) for m in self.gpu_models
        )
        for job in jobs:
            job.max_gpus = min(job.max_gpus, pool)
            job.requested_gpus = min(job.requested_gpus, pool)
            job.min_gpus = min(job.min_gpus, job.max_gpus)
        self.pending = sorted(jobs, key=lambda j: j.submit_s)
        self.arrived: list[Job] = []
        self.finished: list[Job] = []
        self.failed: list[Job] = []
        self.now = 0.0
        self._cache: dict[tuple[object, ...], Estimate] = {}
        for job in self.pending:
            job.straggler_cv = sample_cv(rng) if config.noise else median_cv()
            config0, batch = job_config(
                job, Choice.for_gpus(job.requested_gpus, batch=_unit_batch_index())
            )
            shape = Shape(gpu_model=self.reference_gpu, ranks_per_node=(config0.layout.world_size,))
            ref = self.estimate(job, config0, batch, shape, noise_free=True)
            # Ignore memory here: the reference is a unit of speed, not a config to run.
            job.reference_goodput = ref.step.samples_per_s * ref.efficiency
            if job.work <= 0:
                if not job.duration_s:
                    raise ValueError(f"job {job.job_id}: neither work nor duration")
                job.work = job.duration_s * job.reference_goodput
        self._admit_arrivals()

    # -- queries ------------------------------------------------------------------------

    @property
    def active(self) -> list[Job]:
        """Arrived, unfinished jobs in queue order (running ones keep their place)."""
        jobs = [j for j in self.arrived if not j.done]
        if self.config.queue_order == "las":
            # Tiresias' two priority queues, FIFO within each (Gu et al., NSDI'19).
            jobs.sort(key=lambda j: (j.attained_gpu_s >= LAS_THRESHOLD_GPU_S, j.submit_s))
        return jobs

    @property
    def done(self) -> bool:
        return not self.pending and all(j.done for j in self.arrived)

    def free_gpus(self, gpu_model: str | None = None) -> int:
        return sum(
            f
            for f, n in zip(self.free, self.nodes, strict=True)
            if gpu_model is None or n.gpu_model == gpu_model
        )

    def estimate(
        self, job: Job, config: JobConfig, batch: int, shape: Shape, *, noise_free: bool = False
    ) -> Estimate:
        cv = median_cv() if noise_free else job.straggler_cv
        key = (job.model.name, id(job.coeffs), config, batch, shape, cv)
        hit = self._cache.get(key)
        if hit is None:
            hit = estimate(job.model, config, shape, batch, coeffs=job.coeffs, straggler_cv=cv)
            micro = config.layout.micro_batches
            while hit.oom and micro < MAX_ACCUMULATION and micro * 2 * config.layout.dp <= batch:
                # Gradient accumulation (or more pipeline micro-batches) until it fits, as
                # the executor does before it gives up.
                micro *= 2
                layout = replace(config.layout, micro_batches=micro)
                fitted = replace(config, layout=layout)
                hit = estimate(job.model, fitted, shape, batch, coeffs=job.coeffs, straggler_cv=cv)
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def best_shape(self, gpus: int, exclude: Job | None = None) -> Shape | None:
        """Where ``gpus`` GPUs would go now (counting ``exclude``'s own as free)."""
        plan = self._pack(gpus, exclude)
        if plan is None:
            return None
        model, alloc = plan
        return self._shape(model, alloc)

    # -- dynamics -----------------------------------------------------------------------

    def advance(self, choices: dict[str, Choice | None]) -> RoundOutcome:
        """Apply ``choices`` (job id -> new choice; ``None`` or absent: keep), admit in
        queue order, then run ``interval_s`` of training."""
        restarts = 0
        for job in self.active:
            choice = choices.get(job.job_id)
            if choice is None or choice == job.choice:
                continue
            if job.running:
                restarts += 1
                job.downtime_s = self.config.restart_s
                self._release(job)
            job.choice = choice
        order = self.active
        if self.config.queue_order == "las":
            restarts += self._preempt(order)
        blocked = False
        for job in order:
            if job.running:
                continue
            if job.choice is None:
                job.choice = Choice.for_gpus(job.requested_gpus)
            config, _ = job_config(job, job.choice)
            if blocked:
                continue
            if not self._allocate(job, config.layout.world_size):
                blocked = True  # strict order: nobody behind a waiting job starts
                continue
            if job.start_s is None:
                job.start_s = self.now
        return self._run(restarts)

    def _preempt(self, order: list[Job]) -> int:
        """Least-attained-service: the jobs that fit first in priority order run; running
        jobs outside that set are preempted (they pay a restart when they resume)."""
        room = self.total_gpus
        keep: set[str] = set()
        for job in order:
            config, _ = job_config(job, job.choice or Choice.for_gpus(job.requested_gpus))
            if config.layout.world_size > room:
                break
            room -= config.layout.world_size
            keep.add(job.job_id)
        preempted = 0
        for job in order:
            if job.running and job.job_id not in keep:
                self._release(job)
                job.downtime_s = self.config.restart_s
                preempted += 1
        return preempted

    def _run(self, restarts: int) -> RoundOutcome:
        dt = self.config.interval_s
        end = self.now + dt
        total_norm = 0.0
        energy_j = 0.0
        nans = 0
        ooms = 0
        finished = 0
        busy = 0
        for job in self.active:
            if not job.running:
                continue
            assert job.choice is not None
            busy += job.gpus
            config, batch = job_config(job, job.choice)
            shape = self._shape(job.gpu_model, job.allocation)
            est = self.estimate(job, config, batch, shape)
            job.oom = est.oom
            job.last_samples_per_s = 0.0 if est.oom else est.step.samples_per_s
            job.last_goodput = est.goodput
            run_s = max(0.0, dt - job.downtime_s)
            job.downtime_s = max(0.0, job.downtime_s - dt)
            job.attained_gpu_s += job.gpus * dt
            energy_j += est.power_watts * dt
            if est.oom:
                # Out of memory at start-up: the job crashes and leaves the cluster.
                ooms += 1
                job.failed = True
                job.finish_s = self.now
                self._release(job)
                self.failed.append(job)
                continue
            rate = est.divergence_per_hour * run_s / 3600
            events = int(self.rng.poisson(rate)) if self.config.noise and rate > 0 else 0
            if events:
                # The executor rolls back to its last checkpoint (half a round on average)
                # and moves the offending classes to a safer precision.
                nans += events
                job.nan_events += events
                run_s *= 0.5
                job.choice = Choice(
                    compression=job.choice.compression,
                    precision=max(0, min(job.choice.precision, 1)),
                    layout=job.choice.layout,
                    batch=job.choice.batch,
                )
            need = job.work - job.progress
            gained = est.goodput * run_s
            if gained >= need:
                used = need / est.goodput + (dt - run_s)
                job.progress = job.work
                job.finish_s = self.now + min(dt, used)
                # Credit the time it trained, not the restart downtime before it.
                total_norm += need / job.reference_goodput / dt
                self._release(job)
                self.finished.append(job)
                finished += 1
            else:
                job.progress += gained
                total_norm += est.goodput / job.reference_goodput * run_s / dt
        self.now = end
        self._admit_arrivals()
        return RoundOutcome(
            normalized_goodput=total_norm,
            ooms=ooms,
            nan_events=nans,
            restarts=restarts,
            energy_kwh=energy_j / 3.6e6,
            finished=finished,
            busy_gpus=busy,
        )

    def _admit_arrivals(self) -> None:
        while self.pending and self.pending[0].submit_s <= self.now:
            self.arrived.append(self.pending.pop(0))

    def skip_idle(self) -> None:
        """Jump to the next arrival when nothing is active (no decisions to make)."""
        if not self.active and self.pending:
            step = self.config.interval_s
            gap = self.pending[0].submit_s - self.now
            self.now += math.ceil(gap / step) * step
            self._admit_arrivals()

    # -- allocation ---------------------------------------------------------------------

    def _pack(self, gpus: int, exclude: Job | None) -> tuple[str, dict[int, int]] | None:
        free = list(self.free)
        if exclude is not None:
            for i, n in exclude.allocation.items():
                free[i] += n
        for model in self.gpu_models:
            idx = [i for i, n in enumerate(self.nodes) if n.gpu_model == model and free[i] > 0]
            if sum(free[i] for i in idx) < gpus:
                continue
            fits = [i for i in idx if free[i] >= gpus]
            if fits:  # one node: the tightest that fits
                best = min(fits, key=lambda i: (free[i], i))
                return model, {best: gpus}
            alloc: dict[int, int] = {}
            left = gpus
            for i in sorted(idx, key=lambda i: (-free[i], i)):
                take = min(left, free[i])
                alloc[i] = take
                left -= take
                if left == 0:
                    return model, alloc
        return None

    def _allocate(self, job: Job, gpus: int) -> bool:
        plan = self._pack(gpus, None)
        if plan is None:
            return False
        model, alloc = plan
        for i, n in alloc.items():
            self.free[i] -= n
        job.allocation = alloc
        job.gpus = gpus
        job.gpu_model = model
        job.ranks_per_node = tuple(alloc.values())
        return True

    def _release(self, job: Job) -> None:
        for i, n in job.allocation.items():
            self.free[i] += n
        job.allocation = {}
        job.gpus = 0

    def _shape(self, model: str, alloc: dict[int, int]) -> Shape:
        nodes = [self.nodes[i] for i in alloc]
        return Shape(
            gpu_model=model,
            ranks_per_node=tuple(alloc.values()),
            inter_node_gbps=min(n.inter_node_bandwidth_gbps for n in nodes),
        )


def _unit_batch_index() -> int:
    return BATCH_SCALES.index(1.0)
