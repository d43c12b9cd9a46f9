"""Response schemas (``XPublic`` for one item, ``XsPublic`` for a page of them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "ClusterPublic",
    "DecisionPublic",
    "DecisionsPublic",
    "Health",
    "JobPublic",
    "JobsPublic",
    "NodePublic",
]


class Health(BaseModel):
    status: str = "ok"
    version: str


class NodePublic(BaseModel):
    node_id: str
    gpu_model: str
    gpu_count: int
    gpus_allocated: float = Field(description="GPUs in use by running jobs (fractions count)")
    gpu_memory_bytes: int
    cpu_milli: int
    memory_mib: int


class ClusterPublic(BaseModel):
    telemetry: str = Field(description="Where the figures come from: simulator, nvml, ...")
    gpus_total: int
    gpus_allocated: float
    jobs: dict[str, int] = Field(description="Jobs per state")
    nodes: list[NodePublic]


class JobPublic(BaseModel):
    job_id: str
    state: str
    state_reason: str = Field(description="Why the job waits, when it does")
    progress: float
    submitted_at: datetime
    updated_at: datetime
    spec: dict[str, Any]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int = Field(description="Jobs matching the filters, over all pages")


class DecisionPublic(BaseModel):
    id: int
    job_id: str
    source: str
    policy_version: str
    decided_at: datetime
    applied_at: datetime | None = Field(description="null: committed, not yet applied")
    reason: str
    config: dict[str, Any]
    placement: dict[str, Any] | None


class DecisionsPublic(BaseModel):
    data: list[DecisionPublic]
    count: int = Field(description="Decisions matching the filters, over all pages")
