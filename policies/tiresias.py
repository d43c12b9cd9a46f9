"""Tiresias (Gu et al., NSDI'19) as Pollux's artifact runs it: two-dimensional
least-attained-service scheduling with discretised queues, each job on the GPUs it
asked for.

The rules, from ``simulator/tiresias.py`` of the Pollux artifact (petuum/adaptdl,
branch ``osdi21-artifact``), whose average JCTs the Pollux paper reports:

- a job's *attained service* is the GPU-seconds it has held: every round it is running,
  the time since the last round times its GPUs (restart downtime included);
- two queues: a new job enters queue 0 (first come, first served); once its attained
  service reaches ``threshold_gpu_s`` (57,600 GPU-seconds: 16 GPU-hours) it moves to the
  end of queue 1, for good (the artifact disables starvation promotion);
- every round, jobs are admitted in queue order (queue 0, then queue 1) while their GPUs
  fit the cluster's count; a job that does not fit is skipped, so smaller later jobs
  fill in, and a running job that is not admitted is preempted (it stops after a
  checkpoint and waits with its progress);
- an admitted job runs data parallel on its requested GPUs (``JobSpec.requested_gpus``)
  with its own batch, fp32, no compression; a running job keeps its placement. The
  decision step's Planner places the jobs it starts (the artifact packs them greedily
  onto the nodes with the most free GPUs).
"""

from __future__ import annotations

from typing import Final

from autotune import __version__
from autotune.core import JobConfig
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound

__all__ = ["TIRESIAS_THRESHOLD_GPU_S", "TiresiasPolicy"]

TIRESIAS_THRESHOLD_GPU_S: Final = 3600 * 16
"""The artifact's queue threshold: 16 GPU-hours of attained service."""


class TiresiasPolicy:
    """See the module docstring. It keeps its queues and service counters between
    rounds, as the artifact's policy does, so one instance serves one run."""

    name = "tiresias"

    def __init__(self, threshold_gpu_s: float = TIRESIAS_THRESHOLD_GPU_S) -> None:
        if not threshold_gpu_s > 0:
            raise ValueError(f"threshold_gpu_s={threshold_gpu_s!r}: must be > 0")
        self.threshold_gpu_s = threshold_gpu_s
        self.version = f"tiresias-{__version__}"
        self._queues: tuple[list[str], list[str]] = ([], [])
        self._attained: dict[str, float] = {}
        self._checked: dict[str, float] = {}

    def attained_gpu_s(self, job_id: str) -> float:
        """GPU-seconds the job has held, as the policy counts them."""
        return self._attained.get(job_id, 0.0)

    def queue_of(self, job_id: str) -> int | None:
        for level, queue in enumerate(self._queues):
            if job_id in queue:
                return level
        return None

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        now = snapshot.time_s
        jobs = {j.spec.job_id: j for j in snapshot.jobs if j.state in ("pending", "running")}
        first, second = self._queues
        for queue in self._queues:
            queue[:] = [job_id for job_id in queue if job_id in jobs]
        for job_id in list(self._attained):
            if job_id not in jobs:
                self._attained.pop(job_id)
                self._checked.pop(job_id, None)
        for job_id, job in jobs.items():  # the snapshot lists jobs in arrival order
            if job_id not in self._attained:
                self._attained[job_id] = 0.0
                first.append(job_id)
            elif job.state == "running":
                self._attained[job_id] += (now - self._checked[job_id]) * job.spec.gpu_request()
                if job_id in first and self._attained[job_id] >= self.threshold_gpu_s:
                    first.remove(job_id)
                    second.append(job_id)
            self._checked[job_id] = now
        free = sum(n.gpu_count for n in snapshot.nodes)
        choices: dict[str, PolicyChoice] = {}
        for level, queue in enumerate(self._queues):
            for job_id in queue:
                job = jobs[job_id]
                gpus = job.spec.gpu_request()
                service = self._attained[job_id]
                features = {"queue": float(level), "attained_gpu_s": service, "gpus": gpus}
                if gpus <= free:
                    free -= gpus
                    if job.state == "pending":
                        choices[job_id] = PolicyChoice(
                            config=JobConfig.data_parallel(gpus),
                            reason=f"tiresias: queue {level}, {service:.0f} GPU-s attained; "
                            f"its {gpus} GPU(s), data parallel, fp32",
                            features=features,
                        )
                    continue
                why = (
                    f"tiresias: queue {level}, {service:.0f} GPU-s attained; its {gpus} "
                    "GPU(s) go to jobs ahead of it"
                )
                choices[job_id] = PolicyChoice(
                    config=None, reason=why, features=features, preempt=job.state == "running"
                )
        return PolicyRound(choices=choices)
