"""The metric samples a tick records beside its decisions: each job's goodput and what
the backend measured on its last step, and the provisioner's figures. Each sample is
``(name, value, job_id or None)``, as ``autotune.db.repository.record_metrics`` takes
them."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.interfaces import ClusterSnapshot, JobStatus
from autotune.perf.model import statistical_efficiency
from autotune.provisioning import Provisioner, ProvisioningPlan

__all__ = ["Sample", "goodput_samples", "measured_samples", "provisioning_samples"]

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
