"""The metric samples a tick records beside its decisions: each job's goodput and what
the backend measured on its last step, and the provisioner's figures. Each sample is
``(name, value, job_id or None)``, as ``autotune.db.repository.record_metrics`` takes
them."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.core import JobState
from autotune.interfaces import ClusterSnapshot, JobStatus
from autotune.perf.model import statistical_efficiency
from autotune.provisioning import Provisioner, ProvisioningPlan

__all__ = [
    "JobSampler",
    "Sample",
    "goodput_samples",
    "measured_samples",
    "provisioning_samples",
]

Sample = tuple[str, float, str | None]
"""``(metric name, value, job id or None for the cluster's)``."""


def measured_samples(jobs: Sequence[JobStatus]) -> list[Sample]:
    """What the backend measured on each job's last step, as ``job_<name>``; not a
    backend's own ``goodput``: the daemon's (``goodput_samples``) is the one stored."""
    return [
        (f"job_{name}", float(value), job.spec.job_id)
        for job in jobs
        for name, value in job.metrics.measured()
        if name != "goodput"
    ]


def goodput_samples(snapshot: ClusterSnapshot) -> list[Sample]:
    """Each running job's goodput: measured samples/s times the statistical efficiency
    of its batch, compression and precision (``autotune.perf.model``), its batch's from
    the noise scale it measured where it did (``JobStatus.profile``)."""
    values: list[Sample] = []
    for job in snapshot.by_state("running"):
        if job.config is None:
            continue
        efficiency = statistical_efficiency(job.profile, job.config, job.spec.global_batch)
        values.append(("job_goodput", job.samples_per_s * efficiency, job.spec.job_id))
    return values


class JobSampler:
    """Which jobs' samples a tick records: every running job's every ``every_s``
    seconds; between, those of a job running for the first time, and the last figures of
    every job that ended since the previous tick, including one that started and ended
    between two ticks (a short job's figures are kept whether or not a tick saw it run).
    Jobs that had ended before the first tick are not recorded again."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._at = -float("inf")
        self._sampled: set[str] = set()
        """Running jobs whose samples were recorded at least once."""
        self._seen: set[str] | None = None
        """Every job of the previous tick's snapshot that had not ended; ``None``
        before the first tick."""
        self._all: set[str] = set()
        """Every job of the previous tick's snapshot."""

    def take(self, snapshot: ClusterSnapshot, now: float) -> list[Sample]:
        running = snapshot.by_state("running")
        running_ids = {j.spec.job_id for j in running}
        ended_states: tuple[JobState, ...] = ("finished", "failed", "cancelled")
        ended = [
            j
            for j in snapshot.by_state(*ended_states)
            if j.spec.job_id in self._sampled
            or (
                self._seen is not None
                and (j.spec.job_id in self._seen or j.spec.job_id not in self._all)
            )
        ]
        self._all = {j.spec.job_id for j in snapshot.jobs}
        self._seen = {j.spec.job_id for j in snapshot.jobs if j.state not in ended_states}
        if now - self._at >= self.every_s:
            self._at = now
            chosen = running_ids
        else:
            chosen = running_ids - self._sampled
        self._sampled = (self._sampled | chosen) & running_ids
        if not chosen and not ended:
            return []
        return [
            *(v for v in goodput_samples(snapshot) if v[2] in chosen),
            *measured_samples([j for j in running if j.spec.job_id in chosen]),
            *measured_samples(ended),
        ]


def provisioning_samples(
    snapshot: ClusterSnapshot, provisioner: Provisioner | None, plan: ProvisioningPlan | None
) -> list[Sample]:
    """Parked nodes now, and the provisioner's target (GPUs to keep powered)."""
    parked = float(len(snapshot.parked_nodes) + len(snapshot.waking_nodes))
    if provisioner is None or plan is None:
        return [("nodes_parked", parked, None)] if parked else []
    return [
        ("nodes_parked", parked, None),
        ("provisioning_target_gpus", plan.target_gpus, None),
        ("provisioning_recommended_park", float(len(plan.park)), None),
    ]
