"""Request schemas (``XCreate``) and response schemas (``XPublic`` for one item,
``XsPublic`` for a page of them).

Request bodies are strict (no type coercion: ``"4"`` is not an integer) and reject
unknown fields, so a typo is a 422 naming the field instead of a silent default.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from autotune.catalog.tasks import BUILTIN_TASKS
from autotune.core import (
    ID_PATTERN,
    CompressionKind,
    CompressionSpec,
    DecisionSource,
    JobState,
    Layout,
    NodeState,
    Precision,
)

__all__ = [
    "LINE_PATTERN",
    "ArrivalCheck",
    "ClusterPublic",
    "CompressionPin",
    "DashboardCluster",
    "DashboardDecision",
    "DashboardGpuHold",
    "DashboardJobConfig",
    "DashboardNode",
    "DashboardPublic",
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


_NODE_STATE = (
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
    state: NodeState = Field(default="alive", description=_NODE_STATE)
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


LINE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
"""Text of one line: no control characters (PostgreSQL stores no NUL, a name has no
newline)."""
_GPUS = 4096


def _whole(value: object) -> object:
    """A float with no fraction as the integer it is: JSON Schema's integer (``4.0`` is
    one); other floats, strings and booleans stay wrong for the strict int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_INTEGRAL = BeforeValidator(_whole)
Whole = Annotated[int, _INTEGRAL]
"""A JSON integer: ``4`` or ``4.0``, not ``4.5`` nor ``"4"``. Bounds of an optional one go
before ``_INTEGRAL`` (``Annotated[int, Field(ge=1), _INTEGRAL] | None``): after it,
pydantic writes them into the JSON schema as ``ge``/``le``, which no JSON Schema reads."""


class JobConstraints(_Request):
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
    max_nodes: Annotated[int, Field(ge=1, le=_GPUS), _INTEGRAL] | None = Field(
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


class JobCreate(_Request):
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
        "applications). Also package.module:Name where the daemon's setting task_modules "
        "allow-lists the module (empty by default; any other module is a 422)",
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
    min_gpus: Whole = Field(default=1, ge=1, le=_GPUS, description="Fewest GPUs it runs on")
    max_gpus: Annotated[int, Field(ge=1, le=_GPUS), _INTEGRAL] | None = Field(
        default=None,
        description="Most GPUs it may be given (default: min_gpus); less than min_gpus is "
        "a 422. More than the cluster has leaves it waiting",
    )
    priority: Whole = Field(default=0, ge=-1000, le=1000, description="Higher goes first")
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
    """Layout fields to pin; those not pinned come from the job's current configuration.
    Where world_size, tp and pp are all pinned, dp x tp x pp must equal world_size (dp -1
    or unpinned: world_size / (tp x pp), which must divide). Against the job and the
    cluster (422 with the Planner's reason): world_size within the job's
    min_gpus..max_gpus, tp within a node, and a rank's share of the model in the memory of
    a GPU the job may use."""

    world_size: Annotated[int, Field(ge=1, le=_GPUS), _INTEGRAL] | None = Field(
        default=None, description="Ranks (GPUs): dp x tp x pp"
    )
    dp: Annotated[int, Field(ge=-1, le=_GPUS), _INTEGRAL] | None = Field(
        default=None,
        json_schema_extra={"not": {"const": 0}},
        description="Data-parallel degree; -1: the rest, world_size / (tp x pp)",
    )
    tp: Annotated[int, Field(ge=1, le=64), _INTEGRAL] | None = Field(
        default=None, description="Tensor-parallel degree"
    )
    pp: Annotated[int, Field(ge=1, le=256), _INTEGRAL] | None = Field(
        default=None, description="Pipeline stages"
    )
    micro_batches: Annotated[int, Field(ge=1, le=_GPUS), _INTEGRAL] | None = Field(
        default=None,
        description="Micro-batches per step (gradient accumulation when pp is 1)",
    )
    activation_checkpointing: bool | None = None

    @field_validator("dp")
    @classmethod
    def _dp_is_a_degree(cls, dp: int | None) -> int | None:
        if dp == 0:
            raise ValueError("dp is -1 (the rest) or a degree of 1 and up")
        return dp

    @model_validator(mode="after")
    def _degrees_multiply_out(self) -> Self:
        if self.world_size is not None and self.tp is not None and self.pp is not None:
            dp = -1 if self.dp is None else self.dp
            Layout(world_size=self.world_size, dp=dp, tp=self.tp, pp=self.pp)
        return self


_PRECISION = "Precision of this module class (default: the job's current one)"


class PrecisionPin(_Request):
    """Precisions to pin per module class. fp8 runs only on GPUs that have it (H100 and
    later): with none the job may use, the pin is a 422."""

    embedding: Precision | None = Field(default=None, description=_PRECISION)
    attention_qkv: Precision | None = Field(default=None, description=_PRECISION)
    attention_out: Precision | None = Field(default=None, description=_PRECISION)
    ffn: Precision | None = Field(default=None, description=_PRECISION)
    norm: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="Normalisation layers: not fp8"
    )
    head: Precision | None = Field(default=None, description=_PRECISION)
    optimizer_state: Literal["fp32", "bf16"] | None = Field(
        default=None, description="Optimizer moments: fp32 or bf16"
    )

    @field_validator("norm", mode="before")
    @classmethod
    def _norm_not_fp8(cls, value: object) -> object:
        if value == "fp8":  # the likely mistake, said plainly
            raise ValueError("normalisation cannot run in fp8")
        return value


class CompressionPin(_Request):
    """A whole gradient compression: topk takes a ratio, powersgd a rank, the others
    neither."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "properties": {
                        "kind": {"enum": ["none", "int8", "fp8"]},
                        "ratio": {"type": "null"},
                        "rank": {"type": "null"},
                    }
                },
                {
                    "properties": {
                        "kind": {"const": "topk"},
                        "ratio": {"type": "number"},
                        "rank": {"type": "null"},
                    },
                    "required": ["ratio"],
                },
                {
                    "properties": {
                        "kind": {"const": "powersgd"},
                        "ratio": {"type": "null"},
                        "rank": {"type": "integer"},
                    },
                    "required": ["rank"],
                },
            ]
        }
    )

    kind: CompressionKind
    ratio: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Share of gradient entries top-k keeps: topk only, and required there",
    )
    rank: Annotated[int, Field(ge=1, le=1024), _INTEGRAL] | None = Field(
        default=None,
        description="Rank of the approximation: powersgd only, and required there",
    )

    @model_validator(mode="after")
    def _fits_the_kind(self) -> Self:
        CompressionSpec(kind=self.kind, ratio=self.ratio, rank=self.rank)
        return self


class RankPin(_Request):
    node_id: str = Field(pattern=ID_PATTERN, description="A node of the cluster (else 422)")
    gpu_index: Whole = Field(ge=0, le=1024, description="A GPU of that node: below its gpu_count")


_PIN_TYPES = {
    "layout": "object",
    "precision": "object",
    "compression": "object",
    "placement": "array",
}


class OverrideCreate(_Request):
    """Pin at least one of layout, precision, compression and placement (not null)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [key], "properties": {key: {"type": kind}}}
                for key, kind in _PIN_TYPES.items()
            ]
        }
    )

    job_id: str = Field(
        pattern=ID_PATTERN,
        description="A pending or running job (no such job: 404; one that ended: 409)",
    )
    layout: LayoutPin | None = None
    precision: PrecisionPin | None = None
    compression: CompressionPin | None = None
    placement: Annotated[list[RankPin], Field(min_length=1, max_length=_GPUS)] | None = Field(
        default=None,
        json_schema_extra={"uniqueItems": True},
        description="GPU of rank 0, 1, ..., one rank a GPU (pins the world size too: a "
        "layout's world_size must agree); GPUs of the cluster's nodes, of a model the job "
        "may use, with the memory for one rank",
    )
    ttl_s: float = Field(gt=0, le=30 * 86400, description="Seconds until it expires")
    reason: str = Field(
        min_length=1,
        max_length=1000,
        pattern=r"^[^\x00]*$",
        description="Why, for the decision log (no NUL character)",
    )

    @field_validator("placement")
    @classmethod
    def _one_rank_a_gpu(cls, placement: list[RankPin] | None) -> list[RankPin] | None:
        seen: set[tuple[str, int]] = set()
        for slot in placement or ():
            gpu = (slot.node_id, slot.gpu_index)
            if gpu in seen:
                raise ValueError(f"two ranks on one GPU: {slot.node_id}:{slot.gpu_index}")
            seen.add(gpu)
        return placement


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
    state: NodeState = Field(description=_NODE_STATE)
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
    decisions: list[DashboardDecision] = Field(
        description="Decisions in the window, oldest first (a shadow policy's too)"
    )
    jobs: dict[str, int] = Field(description="Jobs per state")
    shadow: dict[str, Any] = Field(
        description="The shadow version, its agreement and both rounds' predicted goodput"
    )
    cluster: DashboardCluster
    configs: dict[str, DashboardJobConfig] = Field(
        description="By job: the running jobs' and the newest jobs' current configuration"
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
