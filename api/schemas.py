"""Request schemas (``XCreate``) and response schemas (``XPublic`` for one item,
``XsPublic`` for a page of them).

Request bodies are strict (no type coercion: ``"4"`` is not an integer) and reject
unknown fields, so a typo is a 422 naming the field instead of a silent default.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.core import ID_PATTERN, CompressionKind, DecisionSource, JobState, Precision

__all__ = [
    "ArrivalCheck",
    "ClusterPublic",
    "CompressionPin",
    "DecisionExplanation",
    "DecisionPublic",
    "DecisionsPublic",
    "DemandPoint",
    "ForecastPublic",
    "GoodputPair",
    "Health",
    "HorizonForecast",
    "HostPublic",
    "JobConstraints",
    "JobCreate",
    "JobPublic",
    "JobsPublic",
    "LayoutPin",
    "MetricSamplePublic",
    "MetricSamplesPublic",
    "NodePublic",
    "OverrideCreate",
    "OverridePublic",
    "OverridesPublic",
    "Paged",
    "PoliciesPublic",
    "PolicyCreate",
    "PolicyEventPublic",
    "PolicyEventsPublic",
    "PolicyPublic",
    "RankPin",
    "Readiness",
    "ShadowPublic",
    "TickHealthPublic",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Health(BaseModel):
    status: str = "ok"
    version: str


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
    state: Literal["alive", "lost"] = Field(
        default="alive", description="lost: the backend reports the node gone; no job runs there"
    )
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


class JobPublic(BaseModel):
    job_id: str
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


class JobConstraints(_Request):
    gpu_types: Annotated[list[str], Field(min_length=1, max_length=32)] | None = Field(
        default=None, description="GPU models the job may run on (default: any)"
    )
    max_nodes: int | None = Field(default=None, ge=1, le=4096)
    gpu_milli: int = Field(default=1000, ge=1, le=1000, description="Share of each GPU")
    cpu_milli: int = Field(default=0, ge=0, le=10**9)
    memory_mib: int = Field(default=0, ge=0, le=10**9)


class JobCreate(_Request):
    task: str = Field(
        min_length=1,
        max_length=200,
        description="A built-in task (gpt-char, gpt-125m, ...) or an allow-listed module:Name",
    )
    job_id: str | None = Field(default=None, pattern=ID_PATTERN, description="Default: generated")
    steps: int = Field(default=1000, ge=1, le=10**9, description="Optimizer steps to train")
    global_batch: int = Field(default=32, ge=1, le=1 << 20)
    min_gpus: int = Field(default=1, ge=1, le=4096)
    max_gpus: int = Field(default=1, ge=1, le=4096)
    priority: int = Field(default=0, ge=-1000, le=1000, description="Higher goes first")
    constraints: JobConstraints = Field(default_factory=JobConstraints)


_COUNT = (
    "Rows matching the filters over all pages: exact up to 10,000 (count_exact), else a lower bound"
)
_COUNT_EXACT = "Whether count is exact; false: more than count rows match"
_NEXT = (
    "Cursor of the next page (pass it as cursor=); null on the last page. Pages by "
    "cursor cost the same at any depth and never shift when new rows arrive"
)


class Paged(BaseModel):
    count: int = Field(description=_COUNT)
    count_exact: bool = Field(True, description=_COUNT_EXACT)
    next: str | None = Field(None, description=_NEXT)


class JobsPublic(Paged):
    data: list[JobPublic]


class DecisionPublic(BaseModel):
    id: int
    job_id: str
    source: DecisionSource
    policy_version: str
    decided_at: datetime
    applied_at: datetime | None = Field(description="null: committed, not yet applied")
    reason: str
    config: dict[str, Any]
    placement: dict[str, Any] | None
    override_id: int | None = Field(default=None, description="The override it honours")
    preempt: bool = Field(
        default=False,
        description="The job was stopped (after a checkpoint) to wait again; placement null",
    )


class DecisionsPublic(Paged):
    data: list[DecisionPublic]


class MetricSamplePublic(BaseModel):
    name: str
    value: float
    job_id: str | None
    recorded_at: datetime


class MetricSamplesPublic(Paged):
    data: list[MetricSamplePublic]


class DecisionExplanation(BaseModel):
    decision_id: int
    job_id: str
    source: DecisionSource
    override_id: int | None
    features: dict[str, float] = Field(description="Observation features that mattered")
    chosen: dict[str, Any] = Field(description="The configuration and its predicted goodput")
    alternatives: list[dict[str, Any]] = Field(
        description="Neighbouring configurations on the same GPUs, by predicted goodput"
    )
    why: str


class LayoutPin(_Request):
    world_size: int | None = Field(default=None, ge=1, le=4096)
    dp: int | None = Field(default=None, ge=-1, le=4096)
    tp: int | None = Field(default=None, ge=1, le=64)
    pp: int | None = Field(default=None, ge=1, le=256)
    micro_batches: int | None = Field(default=None, ge=1, le=4096)
    activation_checkpointing: bool | None = None


class PrecisionPin(_Request):
    embedding: Precision | None = None
    attention_qkv: Precision | None = None
    attention_out: Precision | None = None
    ffn: Precision | None = None
    norm: Precision | None = None
    head: Precision | None = None
    optimizer_state: Precision | None = None


class CompressionPin(_Request):
    kind: CompressionKind
    ratio: float | None = Field(default=None, gt=0, lt=1, description="topk only")
    rank: int | None = Field(default=None, ge=1, le=1024, description="powersgd only")


class RankPin(_Request):
    node_id: str = Field(pattern=ID_PATTERN)
    gpu_index: int = Field(ge=0, le=1024)


class OverrideCreate(_Request):
    job_id: str = Field(pattern=ID_PATTERN)
    layout: LayoutPin | None = None
    precision: PrecisionPin | None = None
    compression: CompressionPin | None = None
    placement: Annotated[list[RankPin], Field(min_length=1, max_length=4096)] | None = Field(
        default=None, description="GPU of rank 0, 1, ... (pins the world size too)"
    )
    ttl_s: float = Field(gt=0, le=30 * 86400, description="Seconds until it expires")
    reason: str = Field(min_length=1, max_length=1000, description="Why, for the decision log")


class OverridePublic(BaseModel):
    id: int
    job_id: str
    pin: dict[str, Any]
    reason: str
    created_at: datetime
    expires_at: datetime
    deleted_at: datetime | None
    active: bool


class OverridesPublic(BaseModel):
    data: list[OverridePublic]
    count: int


class PolicyPublic(BaseModel):
    version: str = Field(description="<kind>-<first 12 hex digits of the content hash>")
    name: str = Field(description="A person's name for it (the version when none was given)")
    kind: str
    content_hash: str | None = Field(
        default=None, description="SHA-256 of the checkpoint's content; null: no checkpoint"
    )
    checkpoint_path: str | None
    state: Literal["active", "shadow", "registered"] = Field(
        default="registered",
        description="active: it decides; shadow: it decides beside the active one, its "
        "decisions stored and never applied; registered: neither",
    )
    active: bool
    shadow: bool = False
    activated_at: datetime | None = Field(
        default=None, description="When it last became the active version"
    )
    last_error: str | None = Field(
        default=None,
        description="Why the daemon could not load it, when its newest activation or "
        "shadowing failed",
    )
    metrics: dict[str, Any]
    created_at: datetime


class PoliciesPublic(BaseModel):
    data: list[PolicyPublic]
    count: int


class PolicyCreate(_Request):
    checkpoint: str = Field(
        min_length=1,
        max_length=4096,
        description="Absolute path of the checkpoint folder on the daemon's machine (an "
        "RLModule folder, or an algorithm checkpoint holding one). It is loaded, which "
        "unpickles it: register only checkpoints you trust",
    )
    name: str = Field(min_length=1, max_length=128, description="A name for people")
    kind: str = Field(
        default="ppo",
        pattern=r"^[a-z][a-z0-9_]{0,31}$",
        description="The policy family, first part of the version (ppo, bc, ...)",
    )


class PolicyEventPublic(BaseModel):
    id: int
    version: str
    action: str = Field(
        description="register, activate, rollback, shadow, unshadow, activate_failed, shadow_failed"
    )
    at: datetime
    detail: dict[str, Any] = Field(
        description="previous (the version active before, for activate and rollback), "
        "reason, by, ..."
    )


class PolicyEventsPublic(BaseModel):
    data: list[PolicyEventPublic]
    count: int


class GoodputPair(BaseModel):
    shadow: float | None = Field(description="The shadow's rounds, mean per tick")
    active: float | None = Field(description="The active policy's rounds, mean per tick")


class ShadowPublic(BaseModel):
    version: str
    name: str
    active_version: str | None = Field(description="The version it is compared with")
    since: datetime | None = Field(description="When it became the shadow")
    ticks: int = Field(description="Ticks it decided beside the active policy since then")
    agreement: float | None = Field(
        description="Share of the jobs in the active policy's slots for which both chose "
        "the same (both kept, or the same configuration), over every tick shadowed"
    )
    agreement_recent: float | None = Field(description="The same over the newest ticks")
    recent_ticks: int = Field(description="How many ticks the recent figures cover")
    predicted_goodput: GoodputPair = Field(
        description="Predicted cluster goodput after each policy's round, over every tick"
    )
    predicted_goodput_recent: GoodputPair = Field(description="The same over the newest ticks")
    decisions: int = Field(
        description="Shadow decisions stored since then (list them: GET "
        "/decisions?source=shadow&policy_version=VERSION)"
    )


class HorizonForecast(BaseModel):
    """One forecast for one horizon: will new GPU demand arrive, and how high will the
    demand peak."""

    p_arrival: float = Field(
        description="Probability (0 to 1) that new GPU demand arrives within the horizon: "
        "the demand rises from one minute to the next at least once"
    )
    q50: float = Field(description="Median of the peak GPU demand within the horizon, in GPUs")
    q90: float = Field(description="90% quantile of that peak, in GPUs")
    q95: float = Field(description="95% quantile of that peak, in GPUs")


class DemandPoint(BaseModel):
    at: datetime = Field(description="Start of the minute (UTC)")
    demand_gpus: float = Field(
        description="GPU demand at that minute, in GPUs: the GPUs running jobs hold plus "
        "the GPUs pending jobs ask for (the newest tick within the minute; a minute "
        "without a tick holds the one before)"
    )
    forecast: dict[int, HorizonForecast] = Field(
        description="Keyed by horizon in minutes: the forecast made at this minute, from "
        "it and the minutes before only, for the horizon after it"
    )


class ArrivalCheck(BaseModel):
    windows: int = Field(description="Forecasts whose horizon has passed within the window shown")
    observed_rate: float | None = Field(
        description="Share of those windows in which new demand did arrive (0 to 1; null "
        "when none has passed)"
    )
    mean_p_arrival: float | None = Field(
        description="Mean arrival probability forecast for those windows (0 to 1; null "
        "when none has passed): close to observed_rate when the forecast is calibrated"
    )


class ForecastPublic(BaseModel):
    predictor: str = Field(
        description="The forecaster that made the forecasts: the first of the daemon's "
        "chain that worked (lstm, persistence + buffer, or none)"
    )
    fallback_reasons: list[str] = Field(
        description="Why each forecaster before it did not (empty when the first worked)"
    )
    minutes: int = Field(description="Minutes of history asked for")
    truncated: bool = Field(
        description="The samples cap was reached: the window starts later than asked"
    )
    capacity_gpus: float = Field(
        description="The cluster's GPUs, parked nodes included (the most seen in the window)"
    )
    now: dict[int, HorizonForecast] | None = Field(
        description="Keyed by horizon in minutes: the forecast made at the newest minute "
        "(null when no demand has been recorded)"
    )
    points: list[DemandPoint] = Field(description="One per minute of the window, oldest first")
    coverage95: dict[int, float | None] = Field(
        description="Keyed by horizon in minutes: share of the forecasts whose horizon has "
        "passed within the window for which the peak demand stayed at or under q95 "
        "(about 0.95 when calibrated; null when none has passed)"
    )
    arrivals: dict[int, ArrivalCheck] = Field(
        description="Keyed by horizon in minutes: how often new demand arrived within the "
        "passed horizons, next to the mean probability forecast for them"
    )


class TickHealthPublic(BaseModel):
    ok: bool = Field(description="The last tick succeeded and the daemon's own policy decided")
    consecutive_failures: int = Field(description="Failed ticks in a row")
    failures_total: int = Field(description="Failed ticks since the daemon started")
    last_error: str | None = Field(description="Type: message of the newest failure")
    last_failure_at: datetime | None
    fallback: bool = Field(description="Deciding with the fallback policy")
    fallback_policy: str | None = Field(description="Its name, while it decides")
    paused: str | None = Field(
        default=None,
        description="Why ticks are paused (the database cannot take them, or the leader "
        "lease was not renewed); null: they are not",
    )
    paused_since: datetime | None = None


class LeaderPublic(BaseModel):
    """Which daemon decides, when several share the database (the leader lease)."""

    daemon: str = Field(description="This daemon (host:pid:random)")
    leading: bool = Field(description="This daemon holds the lease and decides")
    term: int | None = Field(description="The term this daemon leads in; null: it follows")
    leader: str | None = Field(description="The lease's holder as last read")
    leader_term: int | None = Field(description="The lease's term as last read")
    lease_expires_in_s: float | None = Field(
        description="Seconds until the lease expires unless renewed (negative: expired)"
    )
    error: str | None = Field(description="Why the lease could not be read or renewed")


class Readiness(BaseModel):
    status: str
    database: bool
    policy_version: str | None
    tick: TickHealthPublic | None = Field(
        default=None, description="The decision loop's health (null: no daemon in this process)"
    )
    leader: LeaderPublic | None = Field(
        default=None, description="Leadership among the daemons sharing the database"
    )
    reasons: list[str] = Field(default_factory=list, description="Why not ready, in words")
