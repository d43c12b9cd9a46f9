"""Schemas of the cluster route: the nodes, the hosts' live readings and the totals."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from autotune.core import NodeState

__all__ = ["NODE_STATE", "ClusterPublic", "HostPublic", "NodePublic"]


NODE_STATE = (
    "alive: jobs run there; parked: provisioning powered it down; waking: powering up; "
    "lost: the backend reports it gone (no job runs on a node that is not alive)"
)


class NodePublic(BaseModel):
    node_id: str = Field(description="The node's name (on Ray: its host, see backend_node_id)")
    backend_node_id: str | None = Field(
        default=None,
        description="The backend's own id of the node where node_id is a name (Ray's node id)",
    )
    gpu_model: str
    gpu_count: int
    gpus_allocated: float = Field(description="GPUs in use by running jobs (fractions count)")
    gpu_memory_bytes: int
    cpu_milli: int
    memory_mib: int
    state: NodeState = Field(default="alive", description=NODE_STATE)
    lost_at: datetime | None = Field(default=None, description="When the daemon saw it lost")


class HostPublic(BaseModel):
    source: str = Field(description="nvml, psutil or ray")
    readings: dict[str, Any] = Field(description="The source's latest figures")


class ClusterPublic(BaseModel):
    telemetry: str = Field(description="Where the figures come from: simulator, nvml, ...")
    telemetry_sources: list[str] = Field(
        default_factory=list, description="Every source read: the cluster's, then the host's"
    )
    hosts: list[HostPublic] = Field(
        default_factory=list, description="Live readings of the machines the daemon can see"
    )
    gpus_total: int
    gpus_allocated: float
    jobs: dict[str, int] = Field(description="Jobs per state")
    nodes: list[NodePublic]
