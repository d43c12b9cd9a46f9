"""The built-in simulated cluster: a small default cluster and a seeded job stream.

It lets the daemon run anywhere with nothing attached. Jobs arrive as a Poisson process
with models from ``autotune.catalog.profiles``; a running job advances at the compute-bound rate
of ``autotune.perf.model`` for its config and placement, and frees its GPUs when done.
The clock moves by ``seconds_per_tick`` at each ``observe()``, so a run is a pure
function of the seed and the decisions applied.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import ACTIVE_STATES, MILLI_PER_GPU, Decision, JobSpec, NodeInfo
from autotune.envs.presets import default_nodes
from autotune.interfaces import ClusterSnapshot, JobStatus, JobSubmission
from autotune.perf.model import compute_bound_samples_per_s

__all__ = ["SimulatedCluster", "SimulatedClusterConfig"]


# (model, share of arrivals, min GPUs, max GPUs): small models dominate, as in the
# Helios and Philly traces where most jobs use 1-8 GPUs.
_JOB_MIX: tuple[tuple[str, float, int, int], ...] = (
    ("gpt-125m", 0.30, 1, 8),
    ("gpt-350m", 0.20, 1, 8),
    ("bert-large", 0.20, 1, 8),
    ("resnet-50", 0.20, 1, 4),
    ("gpt-1.3b", 0.10, 2, 16),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedClusterConfig:
    seed: int = 0
    seconds_per_tick: float = 120.0
    """Simulated seconds that pass at each ``observe()``."""
    mean_interarrival_s: float = 300.0
    """Mean simulated seconds between job arrivals."""
    initial_jobs: int = 6
    """Jobs waiting when the cluster starts (not when it resumes jobs after a restart)."""
    max_jobs: int | None = None
    """Stop generating jobs after this many (``None``: never)."""
    nodes: tuple[NodeInfo, ...] = field(default_factory=lambda: tuple(default_nodes()))

    def __post_init__(self) -> None:
        if not self.seconds_per_tick > 0:
            raise ValueError(f"seconds_per_tick={self.seconds_per_tick!r}: must be > 0")
        if not self.mean_interarrival_s > 0:
            raise ValueError(f"mean_interarrival_s={self.mean_interarrival_s!r}: must be > 0")
        if self.initial_jobs < 0:
            raise ValueError(f"initial_jobs={self.initial_jobs!r}: must be >= 0")


@dataclass(slots=True, kw_only=True)
class _SimJob:
    status: JobStatus
    target_samples: float
    done_samples: float = 0.0


class SimulatedCluster:
    """A ``Backend`` over a simulated cluster, with ``JobControl``: it also runs jobs
    submitted through the API (their model is the task's profile) and resumes jobs
    after a restart."""

    name = "simulator"

    def __init__(self, config: SimulatedClusterConfig | None = None) -> None:
        self.config = config or SimulatedClusterConfig()
        self._rng = np.random.default_rng(self.config.seed)
        self._nodes = {n.node_id: n for n in self.config.nodes}
        self._jobs: dict[str, _SimJob] = {}
        self._time_s = 0.0
        self._observed = False
        self._generated = 0
        self._next_arrival_s = 0.0
        self._taken: set[str] = set()
        self._restored = False

    def _start_stream(self) -> None:
        """At the first ``observe()``: the initial queue (unless jobs were resumed) and
        the first arrival time."""
        if not self._restored:
            for _ in range(self.config.initial_jobs):
                self._arrive(0.0)
        self._next_arrival_s = self._rng.exponential(self.config.mean_interarrival_s)

    # --- the job stream ---------------------------------------------------------------

    def _arrive(self, at_s: float) -> None:
        limit = self.config.max_jobs
        if limit is not None and self._generated >= limit:
            return
        shares = np.array([share for _, share, _, _ in _JOB_MIX])
        model_name, _, min_gpus, max_gpus = _JOB_MIX[
            int(self._rng.choice(len(_JOB_MIX), p=shares / shares.sum()))
        ]
        # Steps log-uniform in [1e3, 1e4] at a global batch of 256 samples.
        steps = math.exp(self._rng.uniform(math.log(1e3), math.log(1e4)))
        while f"job-{self._generated:05d}" in self._taken or (
            f"job-{self._generated:05d}" in self._jobs
        ):
            self._generated += 1  # the id belongs to a job of an earlier run
        spec = JobSpec(
            job_id=f"job-{self._generated:05d}",
            model=MODEL_CATALOG[model_name],
            global_batch=256,
            min_gpus=min_gpus,
            max_gpus=max_gpus,
            submitted_at=at_s,
        )
        self._generated += 1
        self._jobs[spec.job_id] = _SimJob(
            status=JobStatus(spec=spec, state="pending", task=model_name, steps=round(steps)),
            target_samples=steps * 256,
        )

    # --- JobControl -------------------------------------------------------------------

    def submit(self, job: JobSubmission) -> None:
        job_id = job.spec.job_id
        if job_id in self._jobs:
            raise ValueError(f"job {job_id!r} already exists in the simulated cluster")
        if job.spec.model is None:
            raise ValueError(
                f"task {job.task!r}: the simulated cluster needs a model profile (a built-in "
                "task); module tasks run on a backend that trains them"
            )
        # Queue order among equal priorities is by arrival on the simulated clock.
        spec = replace(job.spec, submitted_at=self._time_s)
        self._jobs[job_id] = _SimJob(
            status=JobStatus(spec=spec, state="pending", task=job.task, steps=job.steps),
            target_samples=float(job.steps * spec.global_batch),
        )

    def cancel(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job {job_id!r} in the simulated cluster")
        if job.status.state in ACTIVE_STATES:
            job.status = replace(job.status, state="cancelled", placement=None, samples_per_s=0.0)

    def restore(
        self, jobs: Sequence[tuple[JobSubmission, JobStatus]], *, taken_ids: Collection[str]
    ) -> None:
        if self._observed:
            raise RuntimeError("restore() must come before the first observe()")
        self._taken = set(taken_ids)
        for submission, status in jobs:
            target = float(submission.steps * submission.spec.global_batch)
            sim_job = _SimJob(
                status=JobStatus(
                    spec=submission.spec,
                    state="pending",
                    progress=status.progress,
                    task=submission.task,
                    steps=submission.steps,
                ),
                target_samples=target,
                done_samples=status.progress * target,
            )
            self._jobs[submission.spec.job_id] = sim_job
            self._restored = True
            if status.state != "running" or status.config is None or status.placement is None:
                continue
            sim_job.status = replace(
                sim_job.status, state="running", config=status.config, placement=status.placement
            )
            try:
                self._check_capacity()
            except ValueError:  # its GPUs no longer exist or are taken: it waits again
                sim_job.status = replace(sim_job.status, state="pending", placement=None)
                continue
            self._update_rate(sim_job)

    # --- Backend ----------------------------------------------------------------------

    def observe(self) -> ClusterSnapshot:
        if self._observed:
            self._advance(self.config.seconds_per_tick)
        else:
            self._start_stream()
        self._observed = True
        return ClusterSnapshot(
            time_s=self._time_s,
            nodes=list(self._nodes.values()),
            jobs=[j.status for j in self._jobs.values()],
            telemetry=self.name,
            gpu_utilization=self._allocated_milli() / self._total_milli(),
        )

    def apply(self, decisions: Sequence[Decision]) -> None:
        changed: list[_SimJob] = []
        for decision in decisions:
            job = self._jobs.get(decision.job_id)
            if job is None:
                raise KeyError(f"no job {decision.job_id!r} in the simulated cluster")
            if decision.placement is None or job.status.state not in ACTIVE_STATES:
                continue
            job.status = replace(
                job.status,
                state="running",
                config=decision.config,
                placement=decision.placement,
            )
            changed.append(job)
        # One check after all moves: a job may take GPUs another one of the same round
        # leaves.
        self._check_capacity()
        for job in changed:
            self._update_rate(job)

    def close(self) -> None:
        self._jobs.clear()

    # --- physics ----------------------------------------------------------------------

    def _advance(self, dt_s: float) -> None:
        end = self._time_s + dt_s
        for job in self._jobs.values():
            status = job.status
            if status.state != "running":
                continue
            job.done_samples += status.samples_per_s * dt_s
            progress = min(1.0, job.done_samples / job.target_samples)
            if progress >= 1.0:
                job.status = replace(
                    status, state="finished", progress=1.0, placement=None, samples_per_s=0.0
                )
            else:
                job.status = replace(status, progress=progress)
        while self._next_arrival_s <= end:
            self._arrive(self._next_arrival_s)
            self._next_arrival_s += self._rng.exponential(self.config.mean_interarrival_s)
        self._time_s = end

    def _update_rate(self, job: _SimJob) -> None:
        status = job.status
        assert status.config is not None
        assert status.placement is not None
        model = status.spec.model
        rate = (
            compute_bound_samples_per_s(model, status.config, status.placement, self._nodes)
            if model is not None
            else 0.0
        )
        job.status = replace(status, samples_per_s=rate)

    def _check_capacity(self) -> None:
        used: dict[tuple[str, int], int] = {}
        for job in self._jobs.values():
            placement = job.status.placement
            if job.status.state != "running" or placement is None:
                continue
            for slot in placement.ranks:
                node = self._nodes.get(slot.node_id)
                if node is None or slot.gpu_index >= node.gpu_count:
                    raise ValueError(f"{job.status.spec.job_id}: no GPU {slot}")
                key = (slot.node_id, slot.gpu_index)
                used[key] = used.get(key, 0) + slot.gpu_milli
                if used[key] > MILLI_PER_GPU:
                    raise ValueError(f"GPU {key} over-committed by {job.status.spec.job_id}")

    def _allocated_milli(self) -> int:
        return sum(
            slot.gpu_milli
            for job in self._jobs.values()
            if job.status.state == "running" and job.status.placement is not None
            for slot in job.status.placement.ranks
        )

    def _total_milli(self) -> int:
        return max(1, sum(n.gpu_count for n in self._nodes.values()) * MILLI_PER_GPU)
