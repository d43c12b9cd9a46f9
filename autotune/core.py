"""Core types: what the cluster has, what a job asks for, and what autotune decides.

Every type is a frozen, slotted, keyword-only dataclass whose invariants are checked in
``__post_init__`` (the torchtitan ``ParallelDims`` habit): an invalid value raises
``FieldError`` (a ``ValueError``) naming the field and the value, so a bad request fails
where it enters and never deep inside the Planner. ``autotune.serde`` turns them into
JSON and back.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Generic, Literal, TypeVar, cast, get_args

from autotune.errors import FieldError

__all__ = [
    "ACTIVE_STATES",
    "APPLIED_SOURCES",
    "COMPRESSION_KINDS",
    "DECISION_SOURCES",
    "DEFAULT_ENERGY_WEIGHT",
    "DEFAULT_RESTART_S",
    "DEFAULT_ROUND_S",
    "DEFAULT_TENANT",
    "ELASTIC_FACTOR",
    "ID_PATTERN",
    "JOB_STATES",
    "MODULE_CLASSES",
    "NODE_STATES",
    "PRECISIONS",
    "CompressionKind",
    "CompressionSensitivity",
    "CompressionSpec",
    "Decision",
    "DecisionSource",
    "JobConfig",
    "JobSpec",
    "JobState",
    "Layout",
    "ModelProfile",
    "NodeInfo",
    "NodeState",
    "Placement",
    "Precision",
    "PrecisionMap",
    "RankSlot",
    "TenantSpec",
    "fast_precisions",
]

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)


def fast_precisions(peaks: Mapping[str, float]) -> frozenset[Precision]:
    """The precisions a device of these peak TFLOP/s (``NodeInfo.peak_tflops``) has a
    fast path for: fp32, a 16-bit type whose peak is above fp32's, fp8 where its peak is
    above every 16-bit one's and fp32's. A precision that is listed but not faster (a
    calibrated CPU measured its bf16 matmuls slower than its fp32 ones, as CPUs without
    bf16 matrix units do) runs, but is no reason to choose it for speed."""
    fp32 = peaks.get("fp32", 0.0)
    fast: set[Precision] = {"fp32"}
    for sixteen in ("bf16", "fp16"):
        if peaks.get(sixteen, 0.0) > fp32:
            fast.add(sixteen)
    if peaks.get("fp8", 0.0) > max(fp32, peaks.get("bf16", 0.0), peaks.get("fp16", 0.0)):
        fast.add("fp8")
    return frozenset(fast)


CompressionKind = Literal["none", "topk", "int8", "fp8", "powersgd"]
COMPRESSION_KINDS: tuple[CompressionKind, ...] = get_args(CompressionKind)

DecisionSource = Literal["policy", "override", "fallback", "static", "shadow"]
DECISION_SOURCES: tuple[DecisionSource, ...] = get_args(DecisionSource)
APPLIED_SOURCES: tuple[DecisionSource, ...] = tuple(s for s in DECISION_SOURCES if s != "shadow")
"""Sources of decisions the daemon takes and applies; ``shadow`` decisions are what a
candidate policy would have decided beside the active one: stored, never applied, never
a job's current decision."""

JobState = Literal["pending", "running", "finished", "failed", "cancelled"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
ACTIVE_STATES: tuple[JobState, ...] = ("pending", "running")
NodeState = Literal["alive", "parked", "waking", "lost"]
"""A node as the daemon last saw it: jobs run on alive ones; provisioning powered parked
ones down and powers waking ones up; the backend reports lost ones gone."""
NODE_STATES: tuple[NodeState, ...] = get_args(NodeState)
"""States of a job that holds or waits for GPUs; the others are final."""

# Identifiers travel through URLs, logs and file names: keep them to a safe alphabet.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_ID_RE = re.compile(ID_PATTERN)

# A whole GPU in milli-GPU, the unit of the Alibaba trace and of Kubernetes GPU sharing.
MILLI_PER_GPU = 1000

DEFAULT_ROUND_S = 300.0
"""Seconds of cluster time between two decisions on the simulated cluster and in the
training environment (the daemon's ``round_s`` setting)."""
DEFAULT_RESTART_S = 30.0
"""Seconds a reconfiguration of a running job costs on the simulated cluster (checkpoint,
tear down, start, restore), and what the observation assumes of a backend that has not
measured one yet."""
ELASTIC_FACTOR = 2
"""A trace job may use up to this many times the GPUs it asked for (as Pollux lets its
jobs do); a job that states no request asks for its maximum over this."""
DEFAULT_ENERGY_WEIGHT = 0.05
"""Normalized goodput the reward gives up per kWh (the daemon's ``energy_weight``)."""


def _fail(owner: str, name: str, value: object, why: str) -> FieldError:
    return FieldError(name, f"{owner}.{name}={value!r}: {why}")


def _check_id(owner: str, name: str, value: str) -> None:
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise _fail(owner, name, value, "must be 1-128 characters of [A-Za-z0-9._:-]")


def _check_int(owner: str, name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(owner, name, value, f"must be an integer >= {minimum}")


def _check_number(owner: str, name: str, value: float, *, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(owner, name, value, "must be a finite number")
    if positive and value <= 0:
        raise _fail(owner, name, value, "must be > 0")
    if not positive and value < 0:
        raise _fail(owner, name, value, "must be >= 0")


# --------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class NodeInfo:
    """One machine of the cluster and what it offers to jobs."""

    node_id: str
    """Unique name of the node (the Alibaba trace's ``sn``, a Ray node id, a hostname)."""
    gpu_model: str
    """Catalog name of the GPU model (``autotune.catalog.devices``); ``""`` for a CPU-only node."""
    gpu_count: int
    """GPUs on the node."""
    gpu_memory_bytes: int
    """Memory of one GPU, in bytes."""
    peak_tflops: Mapping[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s of one GPU per precision (``fp32``, ``bf16``, ``fp16``, ``fp8``).
    A precision the GPU cannot run natively is absent."""
    intra_node_bandwidth_gbps: float
    """GPU-to-GPU bandwidth inside the node, GB/s per direction (NVLink or PCIe)."""
    inter_node_bandwidth_gbps: float
    """Network bandwidth of the node to the rest of the cluster, GB/s per direction."""
    cpu_milli: int
    """Allocatable CPU in milli-cores."""
    memory_mib: int
    """Allocatable host memory in MiB."""
    backend_node_id: str = ""
    """The backend's own identifier of the node where ``node_id`` is a readable name
    instead (Ray's 56-hex-digit node id on ``--backend ray``); ``""`` otherwise."""

    def __post_init__(self) -> None:
        owner = "NodeInfo"
        _check_id(owner, "node_id", self.node_id)
        if not isinstance(self.gpu_model, str):
            raise _fail(owner, "gpu_model", self.gpu_model, "must be a string")
        _check_int(owner, "gpu_count", self.gpu_count, 0)
        _check_int(owner, "gpu_memory_bytes", self.gpu_memory_bytes, 0)
        if self.gpu_count > 0 and (not self.gpu_model or self.gpu_memory_bytes <= 0):
            raise _fail(
                owner, "gpu_model", self.gpu_model, "a node with GPUs needs a model and memory"
            )
        for precision, tflops in self.peak_tflops.items():
            if precision not in PRECISIONS:
                raise _fail(
                    owner, "peak_tflops", precision, f"precision must be one of {PRECISIONS}"
                )
            _check_number(owner, f"peak_tflops[{precision}]", tflops, positive=True)
        _check_number(
            owner, "intra_node_bandwidth_gbps", self.intra_node_bandwidth_gbps, positive=True
        )
        _check_number(
            owner, "inter_node_bandwidth_gbps", self.inter_node_bandwidth_gbps, positive=True
        )
        _check_int(owner, "cpu_milli", self.cpu_milli, 0)
        _check_int(owner, "memory_mib", self.memory_mib, 0)


_T = TypeVar("_T")


class ByIdentity(Generic[_T]):
    """What ``build`` makes of a sequence of nodes, kept for the last ``size`` tuples by
    their identity: a cluster that does not change (a simulator's round after round, the
    same tuple each time) pays for it once. A tuple of frozen ``NodeInfo`` cannot change;
    any other sequence might have since, so it is built anew every call. The tuples are
    held while kept, so an identity is not reused meanwhile."""

    def __init__(self, build: Callable[[Sequence[NodeInfo]], _T], size: int = 8) -> None:
        self.build = build
        self.size = size
        self._kept: OrderedDict[int, tuple[Sequence[NodeInfo], _T]] = OrderedDict()

    def __call__(self, nodes: Sequence[NodeInfo]) -> _T:
        if type(nodes) is not tuple:
            return self.build(nodes)
        found = self._kept.pop(id(nodes), None)
        if found is None or found[0] is not nodes:
            found = (nodes, self.build(nodes))
            if len(self._kept) >= self.size:
                self._kept.popitem(last=False)
        self._kept[id(nodes)] = found  # most recently used last
        return found[1]


@dataclass(frozen=True)
class NodeTable:
    """Facts of a set of nodes that do not depend on what runs on them (``node_table``)."""

    by_id: Mapping[str, NodeInfo]
    gpu_nodes: tuple[NodeInfo, ...]
    """The nodes with GPUs, in the order given."""
    gpus_by_model: Mapping[str, int]
    """GPUs per GPU model."""
    total_gpus: int
    memory_by_model: Mapping[str, int]
    """The least memory of one GPU (bytes) on a node of each GPU model."""
    node_gpus_by_model: Mapping[str, tuple[int, ...]]
    """The GPUs of each node of each GPU model, most first."""


def _node_table(nodes: Sequence[NodeInfo]) -> NodeTable:
    gpu_nodes = tuple(n for n in nodes if n.gpu_count > 0)
    by_model: dict[str, int] = {}
    memory: dict[str, int] = {}
    counts: dict[str, list[int]] = {}
    for n in gpu_nodes:
        m = n.gpu_model
        by_model[m] = by_model.get(m, 0) + n.gpu_count
        memory[m] = min(memory.get(m, n.gpu_memory_bytes), n.gpu_memory_bytes)
        counts.setdefault(m, []).append(n.gpu_count)
    return NodeTable(
        by_id={n.node_id: n for n in nodes},
        gpu_nodes=gpu_nodes,
        gpus_by_model=by_model,
        total_gpus=sum(by_model.values()),
        memory_by_model=memory,
        node_gpus_by_model={m: tuple(sorted(c, reverse=True)) for m, c in counts.items()},
    )


node_table = ByIdentity(_node_table)
"""The ``NodeTable`` of a sequence of nodes (built once per unchanged tuple)."""


# --------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------


MAX_COMPRESSION_EFFICIENCY = 4.0
"""The most a measured compression efficiency says (``ModelProfile.compression_efficiency``):
a compressed run at the target in under a quarter of dense SGD's steps, on a curve of
150 steps averaged over 10, is more likely a flat stretch of the dense curve than a 4x
gain, and the measurement cannot tell them apart."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CompressionSensitivity:
    """What gradient compression costs a model's convergence, as two penalties on the
    progress of a step (``autotune.perf.model.compression_efficiency`` prices with them):
    top-k at ratio p loses ``topk`` x log10(1/p)^2, PowerSGD at rank r loses ``powersgd``
    x 4/r. The catalog's are ``autotune.perf.model.CATALOG_SENSITIVITY``; what they are
    over real jobs, fitted to the executor's measurements, is
    ``autotune.perf.sensitivity``."""

    topk: float
    """0.04 in the catalog: 0.96 at 10%, 0.84 at 1%."""
    powersgd: float
    """The loss at rank 4 (rank 1 loses 4x it)."""

    def __post_init__(self) -> None:
        for name in ("topk", "powersgd"):
            _check_number("CompressionSensitivity", name, getattr(self, name), positive=False)


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelProfile:
    """What the Planner and the performance model need to know about a model."""

    name: str
    parameters: int
    """Trainable parameters."""
    flops_per_sample: float
    """Training FLOPs per sample, forward and backward (about 6 x parameters x tokens for a
    transformer, Kaplan et al. 2020)."""
    activation_bytes_per_sample: float
    """Activation memory kept for the backward pass per sample, whole model, in 16-bit
    precision and without activation checkpointing."""
    num_layers: int
    """Repeated blocks; pipeline stages and activation checkpointing work at this grain."""
    hidden_size: int = 0
    """Transformer hidden size (tensor-parallel message sizes); 0 for other models."""
    seq_len: int = 1
    """Tokens per sample (tensor-parallel message sizes); 1 for other models."""
    reference_batch: int = 32
    """Global batch at which statistical efficiency is 1 (Pollux's M0)."""
    noise_scale: float = 0.0
    """Gradient noise scale in samples (McCandlish et al. 2018); 0: batch size costs no
    statistical efficiency."""
    precision_sensitivity: float = 0.0
    """Chance per hour that 16-bit or fp8 activations diverge (NaN/Inf) without a safer
    map, in [0, 1]."""
    compression_efficiency: tuple[tuple[str, float], ...] = ()
    """Progress per sample under a gradient compression relative to dense SGD, as
    measured of this model (``autotune calibrate --efficiency``): pairs of the
    compression's text form (``str(CompressionSpec)``) and its efficiency in (0,
    ``MAX_COMPRESSION_EFFICIENCY``]: above 1 where the compressed runs reached the target
    in fewer steps than dense SGD on every seed. A compression not in it is charged the
    catalog's constant (``autotune.perf.model.compression_efficiency``)."""
    compression_sensitivity: CompressionSensitivity | None = None
    """What a compression with no measured efficiency costs this model; ``None``: the
    catalog's (``autotune.perf.model.CATALOG_SENSITIVITY``). The simulated cluster draws
    one per job where asked to (``SimConfig.sensitivity``)."""

    def __post_init__(self) -> None:
        owner = "ModelProfile"
        if not isinstance(self.name, str) or not self.name:
            raise _fail(owner, "name", self.name, "must be a non-empty string")
        _check_int(owner, "parameters", self.parameters, 1)
        _check_number(owner, "flops_per_sample", self.flops_per_sample, positive=True)
        _check_number(
            owner, "activation_bytes_per_sample", self.activation_bytes_per_sample, positive=False
        )
        _check_int(owner, "num_layers", self.num_layers, 1)
        _check_int(owner, "hidden_size", self.hidden_size, 0)
        _check_int(owner, "seq_len", self.seq_len, 1)
        _check_int(owner, "reference_batch", self.reference_batch, 1)
        _check_number(owner, "noise_scale", self.noise_scale, positive=False)
        _check_number(owner, "precision_sensitivity", self.precision_sensitivity, positive=False)
        if self.precision_sensitivity > 1:
            raise _fail(owner, "precision_sensitivity", self.precision_sensitivity, "must be <= 1")
        for name, value in self.compression_efficiency:
            if str(CompressionSpec.parse(name)) != name:
                raise _fail(owner, "compression_efficiency", name, "must be str(CompressionSpec)")
            if isinstance(value, bool) or not 0 < value <= MAX_COMPRESSION_EFFICIENCY:
                raise _fail(
                    owner,
                    "compression_efficiency",
                    value,
                    f"{name}: must be in (0, {MAX_COMPRESSION_EFFICIENCY}]",
                )

    def with_noise_scale(self, measured: float | None) -> ModelProfile:
        """This profile with a gradient noise scale measured on the job itself in place
        of the catalog's (``JobMetrics.noise_scale``), so its batch efficiency is its own;
        unchanged where nothing was measured. A measured 0 (no noise: every sample past
        the reference batch is wasted) is kept apart from the catalog's "unknown" 0 as
        the smallest positive scale, ``MEASURED_NOISE_FLOOR``."""
        if measured is None or not math.isfinite(measured) or measured < 0:
            return self
        return replace(self, noise_scale=max(float(measured), MEASURED_NOISE_FLOOR))

    def with_compression_efficiency(self, measured: Mapping[str, float] | None) -> ModelProfile:
        """This profile with the compression efficiencies ``measured`` of it (by the
        compression's text form) in place of what it had for those compressions;
        unchanged where nothing was measured."""
        if not measured:
            return self
        merged = dict(self.compression_efficiency) | {
            str(CompressionSpec.parse(k)): float(v) for k, v in measured.items()
        }
        return replace(self, compression_efficiency=tuple(sorted(merged.items())))


MEASURED_NOISE_FLOOR = 1e-6
"""The smallest noise scale a measurement sets (``ModelProfile.with_noise_scale``)."""

DEFAULT_TENANT = "default"
"""The tenant that exists from the start: the operators', whose admin holds the first
token, and the owner of every job submitted before tenants existed."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TenantSpec:
    """A team or user sharing the cluster, with the GPUs it is promised.

    ``gpus`` is the nominal quota over all GPU models, ``gpus_by_model`` the part of it
    (or, where ``gpus`` is 0, all of it) promised on given models; a tenant with work
    gets at least its nominal quota. ``borrow``: its jobs may run on GPUs beyond the
    quota that others leave idle; ``lend``: others may run on its idle nominal GPUs
    (taken back, by preemption, when its own jobs arrive). ``weight`` splits what is
    left over between borrowing tenants (fair share)."""

    name: str
    gpus: int = 0
    gpus_by_model: Mapping[str, int] = field(default_factory=dict)
    borrow: bool = True
    lend: bool = True
    weight: float = 1.0

    def __post_init__(self) -> None:
        owner = "TenantSpec"
        _check_id(owner, "name", self.name)
        _check_int(owner, "gpus", self.gpus, 0)
        by_model = dict(self.gpus_by_model)
        for model, count in by_model.items():
            if not isinstance(model, str) or not model:
                raise _fail(owner, "gpus_by_model", by_model, "keys must be GPU model names")
            _check_int(owner, f"gpus_by_model[{model}]", count, 0)
        object.__setattr__(self, "gpus_by_model", by_model)
        _check_number(owner, "weight", self.weight, positive=True)

    @property
    def nominal_gpus(self) -> int:
        """GPUs promised in all: ``gpus``, or the sum over models where that is 0."""
        return self.gpus or sum(self.gpus_by_model.values())

    def overpromised(self) -> str | None:
        """Why the promises on given models do not fit the quota they are part of (they
        add up to more than ``gpus``), or ``None``. Refused when a tenant is created or
        changed (``POST``/``PATCH /tenants``); one stored before that rule is read as it
        is, its promises kept per model and its total at ``gpus``."""
        promised = sum(self.gpus_by_model.values())
        if self.gpus and promised > self.gpus:
            return (
                f"promises {promised} GPUs on given models, more than the quota of "
                f"{self.gpus} in all (gpus) it is part of"
            )
        return None


@dataclass(kw_only=True, slots=True, frozen=True)
class JobSpec:
    """A training job as submitted: what it trains and the resources it may use."""

    job_id: str
    model: ModelProfile | None = None
    """``None`` for an opaque job (a trace pod): no model-based memory check is possible."""
    global_batch: int = 1
    """Samples per optimizer step, summed over data-parallel ranks."""
    min_gpus: int = 1
    max_gpus: int = 1
    gpu_milli: int = MILLI_PER_GPU
    """Share of each GPU a rank uses, in milli-GPU; below 1000 the job is a single rank
    that may share its GPU with other such jobs."""
    gpu_types: tuple[str, ...] | None = None
    """GPU models the job may run on; ``None`` means any."""
    max_nodes: int | None = None
    """Most nodes the job may span; 1 for a job that must stay on one machine (a pod)."""
    cpu_milli: int = 0
    """Host CPU for the whole job, in milli-cores, split evenly over its ranks."""
    memory_mib: int = 0
    """Host memory for the whole job, in MiB, split evenly over its ranks."""
    priority: int = 0
    """Higher goes first."""
    tenant: str = DEFAULT_TENANT
    """The team or user the job belongs to (``TenantSpec.name``): whose quota it uses."""
    submitted_at: float = 0.0
    """Submission time in seconds; earlier goes first among equal priorities."""
    requested_gpus: int | None = None
    """The GPUs the job asks for (a trace job's request), within [min_gpus, max_gpus]:
    what policies that run jobs as submitted (static, Tiresias) give it. ``None``: not
    stated (``gpu_request`` then derives one)."""

    def __post_init__(self) -> None:
        owner = "JobSpec"
        _check_id(owner, "job_id", self.job_id)
        _check_int(owner, "global_batch", self.global_batch, 1)
        _check_int(owner, "min_gpus", self.min_gpus, 1)
        _check_int(owner, "max_gpus", self.max_gpus, 1)
        if self.max_gpus < self.min_gpus:
            raise _fail(owner, "max_gpus", self.max_gpus, f"must be >= min_gpus={self.min_gpus}")
        _check_int(owner, "gpu_milli", self.gpu_milli, 1)
        if self.gpu_milli > MILLI_PER_GPU:
            raise _fail(owner, "gpu_milli", self.gpu_milli, "must be <= 1000 (one whole GPU)")
        if self.gpu_milli < MILLI_PER_GPU and self.max_gpus != 1:
            raise _fail(
                owner, "gpu_milli", self.gpu_milli, "a fraction of a GPU is only for 1-GPU jobs"
            )
        if self.gpu_types is not None:
            if not self.gpu_types or not all(isinstance(t, str) and t for t in self.gpu_types):
                raise _fail(owner, "gpu_types", self.gpu_types, "must be non-empty model names")
            object.__setattr__(self, "gpu_types", tuple(sorted(set(self.gpu_types))))
        if self.max_nodes is not None:
            _check_int(owner, "max_nodes", self.max_nodes, 1)
        _check_int(owner, "cpu_milli", self.cpu_milli, 0)
        _check_int(owner, "memory_mib", self.memory_mib, 0)
        _check_int(owner, "priority", self.priority, -(2**31))
        _check_id(owner, "tenant", self.tenant)
        _check_number(owner, "submitted_at", self.submitted_at, positive=False)
        if self.requested_gpus is not None:
            _check_int(owner, "requested_gpus", self.requested_gpus, self.min_gpus)
            if self.requested_gpus > self.max_gpus:
                raise _fail(
                    owner,
                    "requested_gpus",
                    self.requested_gpus,
                    f"must be <= max_gpus={self.max_gpus}",
                )

    def gpu_request(self) -> int:
        """The GPUs the job asks for: its stated request, else its elastic maximum over
        ``ELASTIC_FACTOR``, at least its minimum. What a pending job adds to the
        cluster's demand, and what policies that run jobs as submitted give it."""
        if self.requested_gpus is not None:
            return self.requested_gpus
        return max(self.min_gpus, self.max_gpus // ELASTIC_FACTOR)

    def allows(self, gpu_model: str) -> bool:
        """Whether the job may run on GPUs of this model."""
        return self.gpu_types is None or gpu_model in self.gpu_types


# --------------------------------------------------------------------------------------
# The configuration autotune chooses for a job
# --------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class Layout:
    """Parallel layout ``dp x tp x pp == world_size``; one degree may be ``-1``: the rest.

    Ranks are numbered with tensor parallelism innermost, then data, then pipeline
    (``rank = (pp_index * dp + dp_index) * tp + tp_index``), the order torchtitan's
    device mesh uses, so the ranks of a tensor-parallel group are consecutive.
    """

    world_size: int
    dp: int = -1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    """Micro-batches per step: pipeline micro-batches, or gradient accumulation steps
    when ``pp == 1``."""
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        owner = "Layout"
        _check_int(owner, "world_size", self.world_size, 1)
        degrees = {"dp": self.dp, "tp": self.tp, "pp": self.pp}
        rest = [name for name, degree in degrees.items() if degree == -1]
        if len(rest) > 1:
            raise _fail(owner, rest[1], -1, "only one of dp, tp, pp may be -1")
        for name, degree in degrees.items():
            if degree != -1:
                _check_int(owner, name, degree, 1)
        if rest:
            known = math.prod(d for d in degrees.values() if d != -1)
            if self.world_size % known:
                raise _fail(
                    owner, rest[0], -1, f"world_size={self.world_size} is not divisible by {known}"
                )
            object.__setattr__(self, rest[0], self.world_size // known)
        if self.dp * self.tp * self.pp != self.world_size:
            raise _fail(
                owner,
                "world_size",
                self.world_size,
                f"must equal dp*tp*pp = {self.dp}*{self.tp}*{self.pp}",
            )
        _check_int(owner, "micro_batches", self.micro_batches, 1)
        if not isinstance(self.activation_checkpointing, bool):
            raise _fail(owner, "activation_checkpointing", self.activation_checkpointing, "bool")


MODULE_CLASSES: tuple[str, ...] = (
    "embedding",
    "attention_qkv",
    "attention_out",
    "ffn",
    "norm",
    "head",
    "optimizer_state",
)


@dataclass(kw_only=True, slots=True, frozen=True)
class PrecisionMap:
    """Precision per module class.

    ``fp8`` is e4m3 with per-block scales (DeepSeek-V3's fine-grained FP8); it is for
    matmul-heavy classes only. Optimizer moments stay in fp32 or bf16.
    """

    embedding: Precision = "fp32"
    attention_qkv: Precision = "fp32"
    attention_out: Precision = "fp32"
    ffn: Precision = "fp32"
    norm: Precision = "fp32"
    head: Precision = "fp32"
    optimizer_state: Precision = "fp32"

    def __post_init__(self) -> None:
        for name in MODULE_CLASSES:
            value = getattr(self, name)
            if value not in PRECISIONS:
                raise _fail("PrecisionMap", name, value, f"must be one of {PRECISIONS}")
        if self.norm == "fp8":
            raise _fail("PrecisionMap", "norm", self.norm, "normalisation cannot run in fp8")
        if self.optimizer_state not in ("fp32", "bf16"):
            raise _fail(
                "PrecisionMap", "optimizer_state", self.optimizer_state, "must be fp32 or bf16"
            )

    @classmethod
    def uniform(cls, precision: Precision) -> PrecisionMap:
        """Every matmul class in ``precision``; norms and optimizer state stay fp32
        (the usual mixed-precision recipe). fp8 keeps embedding and head in bf16."""
        edge: Precision = "bf16" if precision == "fp8" else precision
        return cls(
            embedding=edge,
            attention_qkv=precision,
            attention_out=precision,
            ffn=precision,
            head=edge,
        )

    def as_dict(self) -> dict[str, Precision]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def lowest(self) -> Precision:
        """The narrowest precision any compute class uses."""
        order = {p: i for i, p in enumerate(PRECISIONS)}  # fp32 < bf16 < fp16 < fp8
        compute = [getattr(self, n) for n in MODULE_CLASSES if n != "optimizer_state"]
        return max(compute, key=lambda p: order[p])


@dataclass(kw_only=True, slots=True, frozen=True)
class CompressionSpec:
    """How a job compresses gradients in its data-parallel reduction."""

    kind: CompressionKind = "none"
    ratio: float | None = None
    """Fraction of gradient entries kept by top-k, in (0, 1); only for ``topk``."""
    rank: int | None = None
    """Rank of the low-rank approximation; only for ``powersgd``."""

    def __post_init__(self) -> None:
        owner = "CompressionSpec"
        if self.kind not in COMPRESSION_KINDS:
            raise _fail(owner, "kind", self.kind, f"must be one of {COMPRESSION_KINDS}")
        if self.kind == "topk":
            if self.ratio is None or isinstance(self.ratio, bool):
                raise _fail(owner, "ratio", self.ratio, "topk needs a ratio in (0, 1)")
            _check_number(owner, "ratio", self.ratio, positive=True)
            if self.ratio >= 1:
                raise _fail(owner, "ratio", self.ratio, "must be in (0, 1)")
        elif self.ratio is not None:
            raise _fail(owner, "ratio", self.ratio, f"only topk takes a ratio, not {self.kind}")
        if self.kind == "powersgd":
            if self.rank is None:
                raise _fail(owner, "rank", self.rank, "powersgd needs a rank >= 1")
            _check_int(owner, "rank", self.rank, 1)
        elif self.rank is not None:
            raise _fail(owner, "rank", self.rank, f"only powersgd takes a rank, not {self.kind}")

    def __str__(self) -> str:
        """The text form the command line takes: ``none``, ``topk:0.01``, ``int8``, ``fp8``,
        ``powersgd:4``."""
        if self.kind == "topk":
            return f"topk:{self.ratio!r}"
        if self.kind == "powersgd":
            return f"powersgd:{self.rank}"
        return self.kind

    @classmethod
    def parse(cls, text: str) -> CompressionSpec:
        """The spec ``text`` names (the inverse of ``str``); ``FieldError`` saying why not."""
        kind, sep, value = text.strip().partition(":")
        if kind not in COMPRESSION_KINDS:
            raise FieldError(
                "compression", f"{text!r}: use none, topk:RATIO, int8, fp8 or powersgd:RANK"
            )
        if kind in ("topk", "powersgd") and not value:
            what = "RATIO" if kind == "topk" else "RANK"
            raise FieldError("compression", f"{text!r}: {kind} needs a value, {kind}:{what}")
        if kind not in ("topk", "powersgd") and sep:
            raise FieldError(
                "compression", f"{text!r}: only topk:RATIO and powersgd:RANK take a value"
            )
        try:
            if kind == "topk":
                return cls(kind="topk", ratio=float(value))
            if kind == "powersgd":
                return cls(kind="powersgd", rank=int(value))
        except ValueError as exc:
            raise FieldError("compression", f"{text!r}: {exc}") from None
        return cls(kind=cast(CompressionKind, kind))


@dataclass(kw_only=True, slots=True, frozen=True)
class JobConfig:
    """How a job trains: parallel layout, precision per module class, gradient compression."""

    layout: Layout
    precision: PrecisionMap = field(default_factory=PrecisionMap)
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    global_batch: int | None = None
    """Samples per optimizer step over all data-parallel ranks; ``None``: the job's own
    (``JobSpec.global_batch``). With ``layout.micro_batches`` it sets the micro-batch
    size, ``ceil(global_batch / (dp * micro_batches))``."""

    def __post_init__(self) -> None:
        if self.global_batch is not None:
            _check_int("JobConfig", "global_batch", self.global_batch, 1)
            if self.global_batch < self.layout.dp:
                raise _fail(
                    "JobConfig",
                    "global_batch",
                    self.global_batch,
                    f"must be >= the data-parallel degree {self.layout.dp}",
                )

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def batch(self, spec: JobSpec) -> int:
        """The global batch this config trains ``spec`` with."""
        return self.global_batch if self.global_batch is not None else spec.global_batch

    def rebatches(self, other: JobConfig | None) -> bool:
        """Whether ``other`` differs from this config at most in its batch (and the
        micro-batches and activation checkpointing the memory rule sets for a batch): the
        same ranks on the same GPUs, so a running job changes from one to the other where
        it runs."""
        if other is None:
            return False
        mine, theirs = self.layout, other.layout
        return (
            (mine.world_size, mine.dp, mine.tp, mine.pp)
            == (theirs.world_size, theirs.dp, theirs.tp, theirs.pp)
            and self.precision == other.precision
            and self.compression == other.compression
        )

    def executor_refusal(self) -> str | None:
        """Why the executor cannot train this configuration, ``None`` when it can.
        PowerSGD runs as DDP's communication hook: on data-parallel layouts only."""
        if self.compression.kind == "powersgd" and (self.layout.tp > 1 or self.layout.pp > 1):
            return (
                "PowerSGD runs as DDP's communication hook, here for data-parallel layouts "
                "only (tp = pp = 1): use topk, int8 or fp8 with tp or pp > 1"
            )
        return None

    @classmethod
    def data_parallel(cls, world_size: int) -> JobConfig:
        """Plain data parallelism in fp32 without compression."""
        return cls(layout=Layout(world_size=world_size))

    def describe(self) -> str:
        """A short summary for people: ``dp=4 tp=2 pp=1 +ckpt, bf16, topk:0.01`` (the
        narrowest precision of the map; the compression as the command line writes it)."""
        layout = self.layout
        parts = f"dp={layout.dp} tp={layout.tp} pp={layout.pp}"
        if layout.pp > 1:
            parts += f" m={layout.micro_batches}"
        if layout.pp == 1 and layout.micro_batches > 1:
            parts += f" accum={layout.micro_batches}"
        if layout.activation_checkpointing:
            parts += " +ckpt"
        if self.global_batch is not None:
            parts += f" batch={self.global_batch}"
        return f"{parts}, {self.precision.lowest()}, {self.compression}"


# --------------------------------------------------------------------------------------
# Where ranks run, and the record of a decision
# --------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class RankSlot:
    """One rank of a job on one GPU of one node."""

    rank: int
    node_id: str
    gpu_index: int
    gpu_milli: int = MILLI_PER_GPU

    def __post_init__(self) -> None:
        owner = "RankSlot"
        _check_int(owner, "rank", self.rank, 0)
        _check_id(owner, "node_id", self.node_id)
        _check_int(owner, "gpu_index", self.gpu_index, 0)
        _check_int(owner, "gpu_milli", self.gpu_milli, 1)
        if self.gpu_milli > MILLI_PER_GPU:
            raise _fail(owner, "gpu_milli", self.gpu_milli, "must be <= 1000")


@dataclass(kw_only=True, slots=True, frozen=True)
class Placement:
    """Where every rank of a job runs: ranks ``0..n-1`` each on a distinct GPU."""

    job_id: str
    ranks: tuple[RankSlot, ...]

    def __post_init__(self) -> None:
        owner = "Placement"
        _check_id(owner, "job_id", self.job_id)
        object.__setattr__(self, "ranks", tuple(sorted(self.ranks, key=lambda s: s.rank)))
        if not self.ranks:
            raise _fail(owner, "ranks", self.ranks, "must hold at least one rank")
        numbers = [s.rank for s in self.ranks]
        if numbers != list(range(len(numbers))):
            raise _fail(owner, "ranks", numbers, "ranks must be 0..n-1, each once")
        gpus = [(s.node_id, s.gpu_index) for s in self.ranks]
        if len(set(gpus)) != len(gpus):
            raise _fail(owner, "ranks", gpus, "two ranks of one job on the same GPU")

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def gpus(self) -> float:
        """The GPUs its ranks hold, in whole-GPU equivalents."""
        return sum(slot.gpu_milli for slot in self.ranks) / MILLI_PER_GPU

    @property
    def nodes(self) -> tuple[str, ...]:
        """Distinct nodes in rank order."""
        return tuple(dict.fromkeys(s.node_id for s in self.ranks))

    def ranks_by_model(self, model_of: Mapping[str, str]) -> dict[str, int]:
        """Ranks per GPU model (``model_of``: node id -> its GPU model), by model name."""
        counts: dict[str, int] = {}
        for slot in self.ranks:
            model = model_of[slot.node_id]
            counts[model] = counts.get(model, 0) + 1
        return dict(sorted(counts.items()))


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(kw_only=True, slots=True, frozen=True)
class Decision:
    """What autotune decided for a job, by whom, and why."""

    job_id: str
    config: JobConfig
    placement: Placement | None
    """``None`` when the job could not be placed (then ``reason`` says why)."""
    source: DecisionSource
    policy_version: str
    reason: str
    decided_at: datetime = field(default_factory=utc_now)
    decision_id: int | None = None
    """Assigned by the database when the decision is committed."""
    preempt: bool = False
    """The job is stopped (after a checkpoint) and waits again, keeping its progress;
    ``config`` is the one it ran with, ``placement`` is ``None``."""

    def __post_init__(self) -> None:
        owner = "Decision"
        _check_id(owner, "job_id", self.job_id)
        if self.source not in DECISION_SOURCES:
            raise _fail(owner, "source", self.source, f"must be one of {DECISION_SOURCES}")
        if not isinstance(self.policy_version, str) or not self.policy_version:
            raise _fail(owner, "policy_version", self.policy_version, "must be a non-empty string")
        if not isinstance(self.reason, str) or not self.reason:
            raise _fail(owner, "reason", self.reason, "must say why")
        if self.decided_at.tzinfo is None:
            raise _fail(owner, "decided_at", self.decided_at, "must be timezone-aware")
        if self.preempt and self.placement is not None:
            raise _fail(owner, "placement", "...", "a preemption places nothing")
        if self.placement is not None:
            if self.placement.job_id != self.job_id:
                raise _fail(owner, "placement", self.placement.job_id, f"is not {self.job_id}")
            if self.placement.world_size != self.config.world_size:
                raise _fail(
                    owner,
                    "placement",
                    self.placement.world_size,
                    f"ranks placed != world_size {self.config.world_size}",
                )
