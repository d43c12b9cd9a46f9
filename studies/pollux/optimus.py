"""Optimus (Peng et al., EuroSys'18) as Pollux's artifact runs it ("Optimus + Oracle +
TunedJobs", ``simulator/optimus.py`` of petuum/adaptdl, branch ``osdi21-artifact``), for
the Pollux-compatible mode.

Each job keeps its workload batch size; Optimus decides its GPU count every round:

- every job first gets one GPU, in arrival order, while GPUs last;
- each further GPU goes to the job with the largest marginal gain,
  (T(n) - T(n + 1)) x its remaining optimizer steps, where T(n) is its step time on n
  GPUs packed onto the fewest nodes (with gradient accumulation past the largest local
  batch, and at least one accumulation step on a single GPU, as the artifact computes
  it) and the remaining steps are the validation runs' iteration count at its batch to
  the last epoch, less the count at its current epoch. Both come from the measured
  traces (the artifact's oracle); a job grows up to its batch over the smallest local
  batch measured (ncf: one GPU, as in the artifact);
- a job left without a GPU is preempted; one whose GPU count is unchanged keeps its
  placement. The decision step's Planner places the others.

Jobs without measured physics (our default world) get their requested GPUs, first come
first served, as ``static`` gives them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from autotune import __version__
from autotune.core import JobConfig
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.studies.pollux.trace import TraceApp, packed, trace_of

if TYPE_CHECKING:
    from autotune.envs.cluster_env import ClusterEnv

__all__ = ["OptimusPolicy"]


class OptimusPolicy:
    """See the module docstring. It reads the jobs' measured physics, as the artifact's
    oracle does."""

    name = "optimus"

    def __init__(self, env: ClusterEnv) -> None:
        self.env = env
        self.version = f"optimus-{__version__}"
        self._step: dict[tuple[str, int, int], float] = {}

    def step_time(self, trace: TraceApp, batch: int, gpus: int, per_node: int) -> float:
        """T(n): seconds per optimizer step of ``batch`` on ``gpus`` packed GPUs, split
        as the artifact's ``predict_step_time`` splits it; ``inf`` where the traces hold
        no such point."""
        key = (trace.name, batch, gpus)
        hit = self._step.get(key)
        if hit is not None:
            return hit
        local = math.ceil(batch / gpus - 1e-8)
        accum = math.ceil(local / trace.max_local - 1e-8) - 1
        if gpus == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(trace.max_batch / (gpus * (accum + 1))))
        try:
            step, sync = trace.step_times(packed(gpus, per_node), atomic)
            value = step + (step - sync) * accum
        except ValueError:
            value = math.inf
        self._step[key] = value
        return value

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        sim = self.env.sim
        assert sim is not None
        per_node = max((n.gpu_count for n in snapshot.nodes), default=1)
        free = sum(n.gpu_count for n in snapshot.nodes)
        active = [j for j in snapshot.jobs if j.state in ("pending", "running")]
        alloc: dict[str, int] = {}
        gain: dict[str, float] = {}
        info: dict[str, tuple[TraceApp, int, float, int]] = {}
        measured = []
        for job in active:
            if trace_of(sim.jobs[job.spec.job_id].arrival) is not None:
                measured.append(job)
                continue
            # No measured physics (our default world): its requested GPUs, set once.
            want = job.spec.gpu_request()
            alloc[job.spec.job_id] = want if want <= free else 0
            free -= alloc[job.spec.job_id]
        for job in measured:
            job_id = job.spec.job_id
            trace = trace_of(sim.jobs[job_id].arrival)
            assert trace is not None
            batch = job.spec.global_batch
            epoch = trace.epoch_of(sim.jobs[job_id].done)
            last = trace.max_epochs - 1
            remaining = (
                1.0
                if epoch >= last
                else trace.iterations(batch, last) - trace.iterations(batch, epoch)
            )
            cap = trace.fixed[0] if trace.fixed is not None else batch // trace.min_local
            info[job_id] = (trace, batch, remaining, cap)
            if free < 1:
                alloc[job_id], gain[job_id] = 0, 0.0
                continue
            alloc[job_id] = 1
            free -= 1
            gain[job_id] = self._gain(job_id, 1, info, per_node, free)
        while free > 0 and gain and max(gain.values()) > 0:
            job_id = max(gain, key=lambda k: gain[k])
            alloc[job_id] += 1
            free -= 1
            gain[job_id] = self._gain(job_id, alloc[job_id], info, per_node, free)
        return PolicyRound(choices=self._choices(active, alloc, {j.spec.job_id for j in measured}))

    def _gain(
        self,
        job_id: str,
        gpus: int,
        info: dict[str, tuple[TraceApp, int, float, int]],
        per_node: int,
        free: int,
    ) -> float:
        trace, batch, remaining, cap = info[job_id]
        if gpus + 1 > cap or free < 1:
            return 0.0
        now = self.step_time(trace, batch, gpus, per_node)
        more = self.step_time(trace, batch, gpus + 1, per_node)
        if math.isinf(more):
            return 0.0
        return (now - more) * remaining

    def _choices(
        self, active: list[JobStatus], alloc: dict[str, int], measured: set[str]
    ) -> dict[str, PolicyChoice]:
        choices: dict[str, PolicyChoice] = {}
        for job in active:
            job_id, n = job.spec.job_id, alloc[job.spec.job_id]
            if job_id not in measured:
                if n and job.state == "pending":
                    choices[job_id] = PolicyChoice(
                        config=JobConfig.data_parallel(n),
                        reason="optimus: requested GPUs (no measured physics)",
                    )
                elif not n and job.state == "pending":
                    choices[job_id] = PolicyChoice(config=None, reason="optimus: no room yet")
                continue
            if n == 0:
                choices[job_id] = PolicyChoice(
                    config=None,
                    reason="optimus: no GPU left for it this round",
                    preempt=job.state == "running",
                )
            elif job.state != "running" or job.config is None or job.config.world_size != n:
                choices[job_id] = PolicyChoice(
                    config=JobConfig.data_parallel(n),
                    reason=f"optimus: {n} GPU(s) by marginal gain on its remaining steps",
                    features={"gpus": float(n)},
                )
        return choices
