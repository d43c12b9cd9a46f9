"""Schemas of the jobs routes: a job to submit (with its constraints), a job and a page
of jobs, and a page of a job's metric samples."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.api.schemas.common import (
    INTEGRAL,
    LINE_PATTERN,
    MAX_GPUS,
    Paged,
    StrictRequest,
    Whole,
)
from autotune.catalog.tasks import BUILTIN_TASKS
from autotune.core import ID_PATTERN, JobState

__all__ = [
    "JobConstraints",
    "JobCreate",
    "JobPublic",
    "JobsPublic",
    "MetricSamplePublic",
    "MetricSamplesPublic",
]


class JobPublic(BaseModel):
    job_id: str
    tenant: str = Field(description="Whose job it is: the quota it uses")
    state: JobState
    state_reason: str = Field(description="Why the job waits, when it does")
    progress: float
    submitted_at: datetime
    updated_at: datetime
    spec: dict[str, Any]
    task: dict[str, Any] | None = Field(
        default=None, description="What it trains: name, steps, origin (api or the backend)"
    )
    cancel_requested: bool = False
    started_at: datetime | None = Field(
        default=None, description="When the daemon first saw the job running; null: not yet"
    )
    finished_at: datetime | None = Field(
        default=None,
        description="When the daemon first saw the job finished, failed or cancelled; "
        "null: still active",
    )
    sim_submitted_s: float | None = Field(
        default=None,
        description="Submission time on the backend's clock, seconds (the simulated "
        "cluster's; null where the backend keeps none)",
    )
    sim_started_s: float | None = Field(
        default=None, description="When the job first ran, on the backend's clock, seconds"
    )
    sim_finished_s: float | None = Field(
        default=None, description="When the job ended, on the backend's clock, seconds"
    )
    performance: dict[str, Any] | None = Field(
        default=None,
        description="Its throughput model fitted online from its measured steps: points "
        "(distinct configurations seen), fitted, fit_error (in-sample MAPE of step time), "
        "coefficients, source (online, or prior: the catalog's until enough points); "
        "null before its first measured step",
    )
    jct_s: float | None = Field(
        default=None,
        description="Job completion time, seconds: sim_finished_s - sim_submitted_s where "
        "the backend's clock gives both, else finished_at - submitted_at; null while active",
    )
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="Newest measured figures (one job only): goodput, and where the job is "
        "trained for real samples_per_s, loss, bytes_sent, bytes_dense, nan_events, ...",
    )


class JobConstraints(StrictRequest):
    gpu_types: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=64, pattern=LINE_PATTERN)]],
            Field(min_length=1, max_length=32),
        ]
        | None
    ) = Field(
        default=None,
        description="GPU models the job may run on (default: any); a model no node has "
        "leaves the job waiting",
    )
    max_nodes: Annotated[int, Field(ge=1, le=MAX_GPUS), INTEGRAL] | None = Field(
        default=None, description="Most nodes it may span (default: any)"
    )
    gpu_milli: Whole = Field(
        default=1000,
        ge=1,
        le=1000,
        description="Share of each GPU a rank uses, in thousandths; below 1000 only for a "
        "job of one GPU (min_gpus and max_gpus 1, else 422)",
    )
    cpu_milli: Whole = Field(
        default=0, ge=0, le=10**9, description="Host CPU for the whole job, in milli-cores"
    )
    memory_mib: Whole = Field(
        default=0, ge=0, le=10**9, description="Host memory for the whole job, in MiB"
    )


class JobCreate(StrictRequest):
    # The one rule between fields JSON Schema can state: a fraction of a GPU (gpu_milli
    # below 1000) is for a one-GPU job only. The route checks it (JobSpec).
    model_config = ConfigDict(
        json_schema_extra={
            "if": {
                "required": ["constraints"],
                "properties": {
                    "constraints": {
                        "required": ["gpu_milli"],
                        "properties": {"gpu_milli": {"exclusiveMaximum": 1000}},
                    }
                },
            },
            "then": {"properties": {"min_gpus": {"const": 1}, "max_gpus": {"enum": [1, None]}}},
        }
    )

    task: str = Field(
        min_length=1,
        max_length=200,
        # Documents the built-in tasks only: module tasks exist where the daemon's settings
        # allow-list their modules (empty by default), which a static schema cannot know.
        json_schema_extra={"enum": list(BUILTIN_TASKS)},
        description="A built-in task (the enum). A daemon that trains for real (--backend "
        "ray) refuses, with 422, those it only simulates (gpt-7b and up, the Pollux "
        "applications). Also hf:<architecture>[-<size>], a Hugging Face transformers model "
        "(hf:gpt2, hf:llama-1b, hf:bert-large, ...; where the daemon has the hf extra), and "
        "package.module:Name or lightning:package.module:Name (a LightningModule) where the "
        "daemon's setting task_modules allow-lists the module (empty by default; any other "
        "module is a 422)",
    )
    job_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="Default: generated; an id that exists is a 409",
    )
    steps: Whole = Field(default=1000, ge=1, le=10**9, description="Optimizer steps to train")
    global_batch: Whole = Field(
        default=32, ge=1, le=1 << 20, description="Samples per step, over all ranks"
    )
    min_gpus: Whole = Field(default=1, ge=1, le=MAX_GPUS, description="Fewest GPUs it runs on")
    max_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS), INTEGRAL] | None = Field(
        default=None,
        description="Most GPUs it may be given (default: min_gpus); less than min_gpus is "
        "a 422. More than the cluster has leaves it waiting",
    )
    priority: Whole = Field(default=0, ge=-1000, le=1000, description="Higher goes first")
    tenant: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="Whose job it is (default: the token's tenant). Only an admin's token "
        "may name another tenant (403); a tenant that does not exist is a 422",
    )
    constraints: JobConstraints = Field(default_factory=JobConstraints)


class JobsPublic(Paged):
    data: list[JobPublic]


class MetricSamplePublic(BaseModel):
    name: str
    value: float
    job_id: str | None
    recorded_at: datetime


class MetricSamplesPublic(Paged):
    data: list[MetricSamplePublic]


class JobEventPublic(BaseModel):
    """Something that happened to the job on the backend while it trained."""

    event_id: int
    job_id: str
    kind: str = Field(
        description="``node_lost``, ``resumed``, ``fenced``, ``fenced_older``, "
        "``reconfigured``, ``grad_norm_growth`` (the guard raised precision), "
        "``nonfinite`` (a step with a NaN or infinite gradient), ``grad_overflow``, "
        "``compression_ratio`` (adaptive top-k moved), ``batch_shares``, "
        "``batch_shares_reset``, ``checkpoint_unreadable``, ``out_of_memory`` (simulated), ..."
    )
    at: datetime = Field(description="When it happened, on the backend's clock")
    detail: dict[str, Any] = Field(
        description="Its other fields: the step, the nodes, the new shares, ..."
    )


class JobEventsPublic(Paged):
    data: list[JobEventPublic]
