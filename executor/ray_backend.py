"""The daemon's ``ray`` backend: jobs submitted through the API are trained for real.

Each job runs in a ``JobRunner`` on its own thread; the daemon's decisions start it on
the Planner's placement and reconfigure it live (``JobRunner.apply``) when its config or
placement changes. ``observe()`` reports the Ray cluster's nodes and, per job, the
measured figures of its last step (throughput, loss, bytes sent, NaN events, power).
Checkpoints live in ``<checkpoint root>/<job id>``, so a job the daemon resumes after a
restart continues from its last checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core import Decision, JobConfig, NodeInfo, Placement
from autotune.executor.cluster import ray_nodes
from autotune.executor.runner import JobRunner, RunnerConfig, ensure_ray
from autotune.interfaces import ClusterSnapshot, JobState, JobStatus, JobSubmission

__all__ = ["RayBackend"]

log = logging.getLogger(__name__)


@dataclass
class _Job:
    submission: JobSubmission
    state: JobState = "pending"
    config: JobConfig | None = None
    placement: Placement | None = None
    runner: JobRunner | None = None
    thread: threading.Thread | None = None
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class RayBackend:
    """Trains submitted jobs on a Ray cluster (``address``) or a local Ray."""

    name = "ray"

    def __init__(
        self,
        *,
        checkpoint_root: Path,
        address: str | None = None,
        checkpoint_every: int = 25,
        device: str = "auto",
    ) -> None:
        import torch

        self._started_ray = ensure_ray(address)
        self._root = checkpoint_root
        self._every = checkpoint_every
        self._device = (
            device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self._jobs: dict[str, _Job] = {}
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self._clock = time.monotonic()

    # ----------------------------------------------------------------- JobControl

    def submit(self, job: JobSubmission) -> None:
        job_id = job.spec.job_id
        with self._lock:
            if job_id in self._jobs or job_id in self._taken:
                raise ValueError(f"job {job_id!r} exists already")
            self._jobs[job_id] = _Job(submission=job)

    def cancel(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise KeyError(job_id)
            if job.state in ("finished", "failed", "cancelled"):
                return
            job.state = "cancelled"
            runner = job.runner
        if runner is not None:
            runner.stop()

    def restore(
        self, jobs: Sequence[tuple[JobSubmission, JobStatus]], *, taken_ids: Collection[str]
    ) -> None:
        """Jobs that were pending or running wait for the daemon's next decision, which
        starts them again from their checkpoint; ended jobs are remembered as they were."""
        with self._lock:
            self._taken.update(taken_ids)
            for submission, status in jobs:
                job = _Job(submission=submission, config=status.config, placement=status.placement)
                if status.state in ("finished", "failed", "cancelled"):
                    job.state = status.state
                self._jobs[submission.spec.job_id] = job

    # ----------------------------------------------------------------- Backend

    def observe(self) -> ClusterSnapshot:
        nodes: list[NodeInfo] = ray_nodes()
        with self._lock:
            statuses = [self._status(job) for job in self._jobs.values()]
            used = sum(
                job.config.world_size
                for job in self._jobs.values()
                if job.state == "running" and job.config is not None
            )
        capacity = sum(n.gpu_count for n in nodes) or 1
        return ClusterSnapshot(
            time_s=time.monotonic() - self._clock,
            nodes=nodes,
            jobs=statuses,
            telemetry="ray",
            gpu_utilization=min(1.0, used / capacity),
        )

    def _status(self, job: _Job) -> JobStatus:
        steps = job.submission.steps
        return JobStatus(
            spec=job.submission.spec,
            state=job.state,
            config=job.config,
            placement=job.placement,
            progress=min(1.0, job.step / steps),
            samples_per_s=job.metrics.get("samples_per_s", 0.0),
            task=job.submission.task,
            steps=steps,
            metrics=dict(job.metrics),
        )

    def apply(self, decisions: Sequence[Decision]) -> None:
        for decision in decisions:
            if decision.placement is None:
                continue
            with self._lock:
                job = self._jobs.get(decision.job_id)
                if job is None or job.state in ("finished", "failed", "cancelled"):
                    continue
                if job.state == "pending":
                    self._start(job, decision.config, decision.placement)
                elif (decision.config, decision.placement) != (job.config, job.placement):
                    assert job.runner is not None
                    job.runner.apply(decision.config, decision.placement)
                    job.config, job.placement = decision.config, decision.placement

    def _start(self, job: _Job, config: JobConfig, placement: Placement) -> None:
        job_id = job.submission.spec.job_id

        def on_step(_runner: JobRunner, step: int, metrics: dict[str, Any]) -> None:
            with self._lock:
                job.step = step
                job.metrics = {
                    key: float(value)
                    for key, value in metrics.items()
                    if isinstance(value, int | float) and key != "step"
                }

        run = RunnerConfig(
            task=job.submission.task,
            steps=job.submission.steps,
            batch_size=config.batch(job.submission.spec),
            checkpoint_dir=self._root / job_id,
            checkpoint_every=self._every,
            device=self._device,
        )
        runner = JobRunner(run, config, placement=placement, on_step=on_step)
        job.runner, job.config, job.placement, job.state = runner, config, placement, "running"
        job.thread = threading.Thread(
            target=self._run, args=(job,), name=f"job-{job_id}", daemon=True
        )
        job.thread.start()

    def _run(self, job: _Job) -> None:
        assert job.runner is not None
        try:
            result = job.runner.run()
        except Exception as exc:  # the job fails; the daemon keeps going
            log.warning("job %s failed: %s", job.submission.spec.job_id, exc)
            with self._lock:
                job.state, job.error = "failed", str(exc).splitlines()[0] if str(exc) else repr(exc)
            return
        with self._lock:
            if job.state == "running":
                job.state = "finished" if result.steps >= job.submission.steps else "pending"
            job.step = result.steps

    def close(self) -> None:
        with self._lock:
            running = [
                j for j in self._jobs.values() if j.runner is not None and j.state == "running"
            ]
        for job in running:
            assert job.runner is not None
            job.runner.stop(checkpoint=True)
        for job in running:
            if job.thread is not None:
                job.thread.join(timeout=120)
        if self._started_ray:
            import ray

            ray.shutdown()
