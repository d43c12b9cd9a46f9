"""Schemas of the dashboard's data route: the cluster map with the GPUs jobs hold, the
jobs' configurations, the decisions of the window, the tenants' use against their
quotas, all in one response."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from autotune.api.schemas.cluster import NODE_STATE
from autotune.api.schemas.jobs import JobEventPublic
from autotune.api.schemas.tenants import TenantPublic
from autotune.core import DecisionSource, NodeState

__all__ = [
    "DashboardCluster",
    "DashboardDecision",
    "DashboardGpuHold",
    "DashboardJobConfig",
    "DashboardNode",
    "DashboardPublic",
]


class DashboardGpuHold(BaseModel):
    """One rank of a running job on one GPU (a shared GPU has several)."""

    gpu_index: int
    job_id: str
    rank: int
    gpu_milli: int = Field(description="Thousandths of the GPU the rank holds (1000: all of it)")


class DashboardNode(BaseModel):
    node_id: str
    gpu_model: str
    gpu_count: int
    state: NodeState = Field(description=NODE_STATE)
    lost_at: datetime | None = Field(default=None, description="When the daemon saw it lost")
    held: list[DashboardGpuHold] = Field(
        description="The GPUs running jobs hold, by their newest decision's placement (a "
        "GPU not listed is free)"
    )


class DashboardCluster(BaseModel):
    """The cluster map: every node the daemon has seen, each GPU with the ranks on it, and
    the newest tick's provisioning figures."""

    nodes: list[DashboardNode]
    gpus_total: int = Field(description="GPUs of the alive nodes the daemon recorded")
    gpus_held: float = Field(description="GPUs running jobs hold (fractions count)")
    at: datetime | None = Field(
        description="The newest tick, which the figures below are from (null: no tick yet)"
    )
    capacity_gpus: float | None = Field(
        description="The cluster's GPUs at that tick, parked and waking nodes included"
    )
    nodes_parked: int | None = Field(
        description="Nodes powered down by provisioning or waking up at that tick (jobs "
        "cannot use them; null: the tick recorded none)"
    )
    provisioning_target_gpus: float | None = Field(
        description="GPUs the provisioner keeps powered (null: no provisioner)"
    )
    provisioning_recommended_park: int | None = Field(
        description="Nodes the provisioner would park (on a backend that cannot park them, "
        "only a recommendation; null: no provisioner)"
    )


class DashboardJobConfig(BaseModel):
    """A job's configuration as its newest decision taken set it."""

    decision_id: int
    source: DecisionSource
    policy_version: str
    override_id: int | None = Field(description="The override that decision honours")
    decided_at: datetime
    preempt: bool = Field(description="That decision stopped the job to wait again")
    gpus: float = Field(description="GPUs its placement holds (0: none, as when preempted)")
    nodes: list[str] = Field(description="Nodes of its placement")
    config: dict[str, Any] = Field(
        description="layout, precision, compression, global_batch (null: the job's own)"
    )


class DashboardDecision(BaseModel):
    id: int
    at: str = Field(description="When decided (ISO 8601)")
    job_id: str
    source: DecisionSource
    policy_version: str
    override_id: int | None
    reason: str = Field(description="Its reason, cut at 200 characters")


class DashboardPublic(BaseModel):
    """Everything the dashboard draws from one response (the page also reads
    ``/jobs``, ``/policies`` and ``/overrides``)."""

    generated_at: datetime = Field(description="When the daemon answered (ages count to it)")
    predictor: str
    demand: dict[str, Any] = Field(
        description="GPU demand per minute, capacity, the 15-minute peak forecast band and "
        "the arrival probabilities"
    )
    goodput: dict[str, dict[str, list[Any]]] = Field(
        description="Per job: at, value (samples/s times statistical efficiency)"
    )
    throughput: dict[str, dict[str, dict[str, list[Any]]]] = Field(
        description="samples_per_s and tokens_per_s measured per job: at, value"
    )
    quality: dict[str, dict[str, dict[str, list[Any]]]] = Field(
        default_factory=dict,
        description="Training quality measured per job (jobs trained for real): loss, "
        "noise_scale (gradient noise scale, samples), compression_cosine (compressed "
        "against dense averaged gradient): at, value",
    )
    decisions: list[DashboardDecision] = Field(
        description="Decisions in the window, oldest first (a shadow policy's too)"
    )
    events: list[JobEventPublic] = Field(
        default_factory=list,
        description="What happened to jobs while they trained, the newest 40 in the "
        "window, newest first (as ``GET /jobs/{id}/events``)",
    )
    jobs: dict[str, int] = Field(description="Jobs per state")
    shadow: dict[str, Any] = Field(
        description="The shadow version, its agreement and both rounds' predicted goodput"
    )
    cluster: DashboardCluster
    configs: dict[str, DashboardJobConfig] = Field(
        description="By job: the running jobs' and the newest jobs' current configuration"
    )
    tenants: list[TenantPublic] = Field(
        default_factory=list,
        description="Every tenant, by name, with its quota and the GPUs its running jobs "
        "hold (as ``GET /tenants``, from the placements the cluster map shows); above "
        "nominal_gpus, a tenant borrows others' idle GPUs",
    )
