"""Performance model: step time, throughput, goodput and power of a job under a config.

Every term below is a formula with its units and source; the free coefficients (what a
measurement can change) live in ``Coefficients`` and are calibrated per model from
measured runs (``autotune.executor.calibrate``, ``autotune.studies.pollux.fit``). Notation:
``d, t, p`` are the data-, tensor- and pipeline-parallel degrees, ``m`` the micro-batches,
``B`` the global batch.

Step time of one rank (seconds)::

    T_compute = (F * B / (d*t*p)) / (peak_dtype * mfu) * recompute / (1 - bubble)
                * straggler(d*t*p) + T_tp + T_pp + overhead
    T_sync    = ring all-reduce (or all-gather for top-k) of the gradient shard
                + compression kernel time
    T_step    = (T_compute^g + T_sync^g)^(1/g)           (Pollux's overlap model, g >= 1)

  With ``Coefficients.executor_reduction`` (autotune's executor, as calibrated on real
  links), the gradients are fp32 under every precision map, int8/fp8 codes (and top-k's
  int64 indices) are all-gathered, and top-k, int8 and fp8 reduce after backward:
  T_step = T_compute + T_sync for them.

- ``peak_dtype``: the device's dense peak for each module class's precision, weighted by
  the class's share of the FLOPs (``memory.PARAMETER_SHARE``: FLOPs follow parameters in
  a dense transformer); see ``class_time_factor``.
- ``recompute`` = 4/3 with activation checkpointing: the forward (1/3 of a training step's
  FLOPs, Kaplan et al. 2020) runs twice.
- ``bubble`` = (p-1)/(m+p-1), the idle share of a GPipe/1F1B pipeline (Huang et al. 2019).
- ``straggler(n)`` = 1 + cv * e(n): synchronous ranks wait for the slowest of n; e(n) is
  the expected maximum of n standard normal draws (Blom's approximation) and cv the
  per-iteration coefficient of variation of worker batch times measured in Alibaba's
  PAI cluster (``autotune.perf.stragglers``).
- Ring all-reduce of S bytes over n ranks (Patarasuk & Yuan 2009; Thakur et al. 2005):
  2(n-1) * alpha + 2(n-1)/n * S / (bandwidth * efficiency); all-gather is half of it.
  Inside one node the link is the GPUs' (NVLink or PCIe); across nodes it is the NIC,
  shared by the ranks of a node: the inter-node term grows as (ranks on the busiest
  node)^delta, the busiest node's NIC bounding the ring. Across nodes, collectives also
  pay a tree latency, 2 log2(n) * alpha_tree (NCCL's double binary trees; Sanders et
  al. 2009), and on exactly two nodes a measured factor (``two_node_sync_factor``:
  Pollux's testbed synchronises 1.5-2x slower there than on 3-4 nodes).
- Compute grows with a rank's samples per micro-step as samples^kappa
  (``batch_exponent``, 1 by default; padded variable-length inputs make it larger).
- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): 4 all-reduces per layer per
  micro-batch (2 forward, 2 backward) of micro_batch * seq_len * hidden activations in
  16-bit, over the GPUs' link inside a node (where the Planner keeps tensor-parallel
  groups on GPU clusters), over the network where a group spans machines (a machine
  holds fewer ranks than the group).
- Pipeline parallelism: each stage sends and receives one activation per micro-batch each
  way: micro_batch * seq_len * hidden values for a transformer; for another model, one
  block's share of its activations (``activation_bytes_per_sample / num_layers``, the
  16-bit figure at the width of the precision map's activations): a ResNet's feature
  maps, which a transformer-shaped message of one value per sample missed.
- One job across GPU models (``Shape.gpu_models``), speed_i being 1 /
  ``class_time_factor`` of rank i's device for the job's precision map: with batch shares
  by speed (``Shape.balanced``, a data-parallel job on a backend that balances them),
  compute takes ``F * B / sum_i(speed_i)``; else every rank runs at the slowest one's
  pace. ``T_compute`` above, priced on ``Shape.gpu_model``'s device, is divided by
  ``balance_gain``, that pace relative to the device's. The gradients cross the slowest
  link (``Shape.inter_node_gbps``) as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Final

from autotune.catalog.devices import DEFAULT_INTER_NODE_GBPS, DeviceSpec, device
from autotune.core import (
    MILLI_PER_GPU,
    CompressionSensitivity,
    CompressionSpec,
    JobConfig,
    Layout,
    ModelProfile,
    NodeInfo,
    Placement,
    Precision,
    PrecisionMap,
)
from autotune.perf.memory import PARAMETER_SHARE, rank_memory

__all__ = [
    "CATALOG_SENSITIVITY",
    "MFU",
    "MIN_COMPRESSION_EFFICIENCY",
    "Coefficients",
    "Estimate",
    "Shape",
    "StepTime",
    "balance_gain",
    "balanced",
    "batch_efficiency",
    "batch_gain",
    "compression_efficiency",
    "compute_bound_samples_per_s",
    "divergence_rate_per_hour",
    "dtype_tflops",
    "effective_peak_tflops",
    "estimate",
    "expected_max_normal",
    "pipeline_bubble",
    "precision_efficiency",
    "rank_batches",
    "rank_speed",
    "ring_allreduce_s",
    "shape_of",
    "statistical_efficiency",
    "step_time",
    "tp_spans_nodes",
]

# Model FLOPs utilisation of a well-tuned dense training step. Megatron-LM reaches 52% of
# peak for GPT-3 175B on A100s (Narayanan et al., SC'21, table 1); PaLM 46% on TPU v4
# (Chowdhery et al. 2022, table 3). 40% leaves room for smaller, less efficient jobs.
MFU: Final = 0.40

# Recomputing the forward pass under activation checkpointing: forward = 1/3 of the
# step's FLOPs, so the step does 4/3 of the work (Chen et al. 2016).
RECOMPUTE_FACTOR: Final = 4 / 3

# A device with no fast path for a 16-bit type runs it through fp32 units after a
# conversion; half the fp32 peak is what such emulation keeps (assumed; T4/V100 bf16).
EMULATED_16BIT_FRACTION: Final = 0.5

# fp8 where the device has no fp8 matmul: the 16-bit path plus quantize/dequantize
# passes over activations and weights, about 10% on top (assumed from the memory traffic
# of blockwise scaling: 1 byte out + 1/128 scale per element, read back once).
FP8_EMULATION_OVERHEAD: Final = 0.10

# Memory-bound kernels reach about 70% of the datasheet bandwidth (typical STREAM-like
# efficiency on HBM; the kernels' own goal).
KERNEL_BANDWIDTH_EFFICIENCY: Final = 0.70

# Bytes moved per gradient element by each compression kernel (read + write), before
# communication: top-k reads grad and residual, estimates a threshold over 4 passes of
# |acc| and writes the residual back; quantization reads fp32 and writes 1 byte + scales,
# dequantization reads them back and writes fp32.
TOPK_BYTES_PER_ELEMENT: Final = 4 * (2 + 4 + 1)
QUANT_BYTES_PER_ELEMENT: Final = 2 * (4 + 1)
INDEX_BYTES: Final = 4
EXECUTOR_INDEX_BYTES: Final = 8
"""Top-k's indices in autotune's kernels (``autotune.kernels.topk_compress``): int64."""
OVERLAPPED: Final = frozenset({"none", "powersgd"})
"""Compression kinds whose reduction the executor overlaps with backward (DDP's hooks)."""

# Idle power of a datacenter GPU as a share of its TDP (NVIDIA's nvidia-smi readings:
# A100 ~50 W of 400 W, H100 ~70-100 W of 700 W, T4 ~10 W of 70 W).
IDLE_POWER_FRACTION: Final = 0.15

# Quality cost of each compression kind, as a multiplier on progress per sample
# (assumed, documented): int8/fp8 blockwise reductions are within noise of fp32
# (Dettmers 2016, 8-bit approximations); PowerSGD at rank >= 4 matches SGD on ResNet and
# LSTM tasks (Vogels et al. 2019, table 4), and the catalog charges it nothing (its one
# shape, penalty x 4/rank, cannot charge rank 1 without rank 4); error-feedback top-k
# converges at SGD's rate after a delay that grows with 1/ratio (Stich et al. 2018), so
# extreme ratios cost more: 1 - 0.04 * log10(1/ratio)^2 (0.96 at 10%, 0.84 at 1%). Real
# jobs differ from these by an order of magnitude either way: PowerSGD at rank 4 cost
# three built-in tasks of four 11-18% (``autotune.perf.sensitivity``).
_QUANTIZED_EFFICIENCY: Final[dict[str, float]] = {"int8": 0.995, "fp8": 0.99}
CATALOG_SENSITIVITY: Final = CompressionSensitivity(topk=0.04, powersgd=0.0)
"""What a compression costs a model nothing was measured of (``ModelProfile.
compression_sensitivity`` ``None``)."""
MIN_COMPRESSION_EFFICIENCY: Final = 0.1
"""The least progress per sample a priced compression keeps."""

# Quality cost of low precision per unit of FLOP share: 16-bit mixed precision matches
# fp32 (Micikevicius et al. 2018); fp8 with fine-grained scales stays within 0.25% of
# bf16's loss (DeepSeek-V3 report, section 3.3), counted here as 2% slower progress.
_PRECISION_PENALTY: Final[dict[Precision, float]] = {
    "fp32": 0.0,
    "bf16": 0.0,
    "fp16": 0.0,
    "fp8": 0.02,
}
# Relative risk of divergence (NaN/Inf) per unit of share, scaled by the model's
# ``precision_sensitivity``: fp16's 5-bit exponent overflows without loss scaling, bf16
# rarely, fp8 e4m3 (max 448) most; a norm below fp32 is the classic failure.
_DIVERGENCE_RISK: Final[dict[Precision, float]] = {
    "fp32": 0.0,
    "bf16": 0.1,
    "fp16": 1.0,
    "fp8": 3.0,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Coefficients:
    """The model's free coefficients; defaults are literature values, calibration fits
    them per model from measured step and synchronisation times."""

    mfu: float = MFU
    """Achieved share of the device's dense peak in the compute phase."""
    compute_overhead_s: float = 0.005
    """Fixed per-step time: optimizer step, data loading, kernel launches (s)."""
    intra_latency_s: float = 10e-6
    """alpha of one ring step inside a node (NCCL over NVLink/PCIe: ~5-10 us)."""
    inter_latency_s: float = 50e-6
    """alpha of one ring step between nodes (TCP or RDMA: ~20-100 us)."""
    intra_bw_efficiency: float = 0.7
    """Achieved bus bandwidth / link bandwidth inside a node (nccl-tests: 70-80%)."""
    inter_bw_efficiency: float = 0.7
    """Achieved bus bandwidth / NIC bandwidth between nodes."""
    node_sharing_exponent: float = 1.0
    """delta: inter-node time grows as (ranks per node)^delta, the ranks of a node sharing
    its NIC (1: each rank's traffic crosses it; 0: hierarchical reduction)."""
    overlap_gamma: float = 1.0
    """Pollux's gamma: T = (Tc^g + Ts^g)^(1/g); 1 is no overlap, larger overlaps more."""
    tree_latency_s: float = 0.0
    """alpha of one step of a tree all-reduce between nodes: 2 log2(n) steps (NCCL's
    double binary trees, used across nodes for small and medium messages; Sanders et al.
    2009). 0 leaves the ring's 2(n-1) steps of ``inter_latency_s`` alone."""
    tp_latency_s: float = 0.0
    """alpha of one ring step of a tensor-parallel group's activation all-reduce between
    nodes, where it differs from the data-parallel reduction's (``inter_latency_s``):
    machines of one device each, where a group spans the network. 0: ``inter_latency_s``."""
    two_node_sync_factor: float = 1.0
    """Multiplies inter-node synchronisation on exactly two nodes. Pollux's testbed
    synchronises 1.5-2x slower on 2 nodes than on 3-4 with the same replicas (bert, 8
    replicas: 1.89 s against 0.89-0.91 s); no ring or tree formula predicts that, so it
    is a measured term of its own (1: none)."""
    batch_exponent: float = 1.0
    """kappa: a rank's compute time per micro-step grows as (its samples)^kappa. 1 is
    linear (fixed-size inputs); Pollux's deepspeech2 fits about 1.3 (utterances are
    padded to the longest of the batch, so a larger batch has longer samples). With
    kappa != 1, ``mfu`` is the utilisation at one sample per micro-step."""
    executor_reduction: bool = False
    """How the gradients are reduced. False, the simulated world's frameworks (which the
    catalog's coefficients, the Pollux comparisons and the shipped policy were fitted and
    trained under): gradients in the matmuls' width, int8/fp8 codes ring-reduced, every
    reduction overlapped with backward. True, autotune's executor as measured on real
    links (what ``autotune calibrate`` fits): fp32 gradients whatever the precision map
    (fp32 master weights), top-k's indices int64, int8/fp8 codes all-gathered (a sum of
    codes would overflow them) and dequantised per rank, and top-k, int8 and fp8 reduced
    once backward is done (only dense and PowerSGD overlap it, through DDP's hooks)."""

    def fitted(self, values: Mapping[str, float]) -> Coefficients:
        """These coefficients with the fitted ``values`` (by field name) in place."""
        updates: dict[str, Any] = dict(values)
        return replace(self, **updates)

    def __post_init__(self) -> None:
        for name in (
            "mfu",
            "intra_bw_efficiency",
            "inter_bw_efficiency",
        ):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"Coefficients.{name}: must be in (0, 1], got {value}")
        if self.overlap_gamma < 1:
            raise ValueError(f"Coefficients.overlap_gamma: must be >= 1, got {self.overlap_gamma}")
        for name in (
            "compute_overhead_s",
            "intra_latency_s",
            "inter_latency_s",
            "tree_latency_s",
            "tp_latency_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"Coefficients.{name}: must be >= 0")
        for name in ("two_node_sync_factor", "batch_exponent"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Coefficients.{name}: must be > 0")


DEFAULT_COEFFICIENTS: Final = Coefficients()


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """Where a job's ranks sit, as far as its speed is concerned: the slowest GPU model,
    the ranks per node, and the share of each GPU it holds."""

    gpu_model: str
    ranks_per_node: tuple[int, ...]
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS
    gpu_milli: int = MILLI_PER_GPU
    gpu_models: tuple[tuple[str, int], ...] = ()
    """``(GPU model, ranks)`` where the ranks run on several models, by name; empty on
    one model (``gpu_model``)."""
    balanced: bool = False
    """Whether ranks on several models take batch shares by speed (the backend balances
    them); else they run at the slowest one's pace."""

    def __post_init__(self) -> None:
        if self.gpu_models and sum(n for _, n in self.gpu_models) != self.world_size:
            raise ValueError(
                f"Shape.gpu_models {self.gpu_models}: {self.world_size} ranks expected"
            )

    @property
    def mixed(self) -> bool:
        """Whether the ranks run on more than one GPU model."""
        return len(self.gpu_models) > 1

    @property
    def world_size(self) -> int:
        return sum(self.ranks_per_node)

    @property
    def nodes(self) -> int:
        return len(self.ranks_per_node)


def shape_of(
    placement: Placement, nodes: Mapping[str, NodeInfo], *, balanced: bool = False
) -> Shape:
    """The speed-relevant summary of a placement: the slowest node's GPU model (by fp32
    peak), the number of ranks on each node, and on each GPU model where several;
    ``balanced``: such ranks take batch shares by speed (``Shape.balanced``)."""
    per_node: dict[str, int] = {}
    for slot in placement.ranks:
        per_node[slot.node_id] = per_node.get(slot.node_id, 0) + 1
    slowest = min(per_node, key=lambda n: nodes[n].peak_tflops.get("fp32", 0.0))
    milli = min(slot.gpu_milli for slot in placement.ranks)
    by_model: dict[str, int] = {}
    for node_id, ranks in per_node.items():
        gpu_model = nodes[node_id].gpu_model or "CPU"
        by_model[gpu_model] = by_model.get(gpu_model, 0) + ranks
    return Shape(
        gpu_model=nodes[slowest].gpu_model or "CPU",
        ranks_per_node=tuple(per_node.values()),
        inter_node_gbps=min(nodes[n].inter_node_bandwidth_gbps for n in per_node),
        gpu_milli=milli,
        gpu_models=tuple(sorted(by_model.items())) if len(by_model) > 1 else (),
        balanced=balanced,
    )


def rank_speed(gpu_model: str, model: ModelProfile, precision: PrecisionMap) -> float:
    """One rank's training speed on ``gpu_model`` (TFLOP/s at 100% of peak): the
    weight its batch share gets beside ranks on other models."""
    return 1.0 / class_time_factor(device(gpu_model), model, precision)


def balanced(config: JobConfig) -> bool:
    """Whether a job's ranks on several GPU models take batch shares by speed: data
    parallelism only (one rank per replica)."""
    return config.layout.tp == 1 and config.layout.pp == 1 and config.layout.dp > 1


def balance_gain(
    shape: Shape, model: ModelProfile, config: JobConfig, spec: DeviceSpec | None = None
) -> float:
    """A step's compute pace on ``shape`` relative to every rank on ``spec`` (default:
    ``shape.gpu_model``'s device): 1 on one GPU model; on several, with batch shares by
    speed (``shape.balanced`` and a ``balanced`` config), the ranks' summed speed over
    ``ranks x spec's speed``; else the slowest rank's speed over ``spec``'s."""
    if not shape.mixed:
        return 1.0
    reference = 1.0 / class_time_factor(spec or device(shape.gpu_model), model, config.precision)
    speeds = [(rank_speed(m, model, config.precision), n) for m, n in shape.gpu_models]
    if shape.balanced and balanced(config):
        return sum(v * n for v, n in speeds) / (shape.world_size * reference)
    return min(v for v, _ in speeds) / reference


def effective_peak_tflops(node: NodeInfo, precision: PrecisionMap) -> float:
    """Peak TFLOP/s of one GPU for the job's narrowest precision; a GPU with no fast
    path for it runs the fp32 path."""
    peak = node.peak_tflops.get(precision.lowest()) or node.peak_tflops.get("fp32")
    if not peak:
        raise ValueError(f"node {node.node_id}: no peak TFLOP/s known")
    return peak


def pipeline_bubble(pp: int, micro_batches: int) -> float:
    """Idle fraction of a 1F1B/GPipe pipeline: (pp-1)/(m+pp-1) (Huang et al. 2019)."""
    return (pp - 1) / (micro_batches + pp - 1)


def compute_bound_samples_per_s(
    model: ModelProfile,
    config: JobConfig,
    placement: Placement,
    nodes: Mapping[str, NodeInfo],
) -> float:
    """Samples/s if compute alone bounded the step: synchronous training runs at the
    pace of the slowest rank, each rank does 1/world of the FLOPs, and the pipeline
    bubble idles a share of the time."""
    slowest = min(
        effective_peak_tflops(nodes[slot.node_id], config.precision) * slot.gpu_milli / 1000
        for slot in placement.ranks
    )
    layout = config.layout
    busy = 1.0 - pipeline_bubble(layout.pp, layout.micro_batches)
    flops_per_s = slowest * 1e12 * MFU * layout.world_size * busy
    return flops_per_s / model.flops_per_sample


def dtype_tflops(peaks: Mapping[str, float], dtype: Precision) -> float:
    """Dense TFLOP/s for matmuls in ``dtype`` of a device of these peaks
    (``DeviceSpec.peak_tflops``, ``NodeInfo.peak_tflops``), emulated where no fast path."""
    fp32 = peaks["fp32"]
    if dtype == "fp32":
        return fp32
    if dtype in peaks:
        return peaks[dtype]
    if dtype == "fp8":
        sixteen = max(peaks.get("bf16", 0.0), peaks.get("fp16", 0.0))
        if sixteen:
            return sixteen / (1 + FP8_EMULATION_OVERHEAD)
    return fp32 * EMULATED_16BIT_FRACTION


def class_time_factor(spec: DeviceSpec, model: ModelProfile, precision: PrecisionMap) -> float:
    """Seconds per TFLOP of the model's training FLOPs on ``spec`` (at 100% of peak):
    sum over module classes of share_c / peak(dtype_c). Models without a transformer
    shape count all FLOPs at the feed-forward class's precision."""
    if model.hidden_size == 0:
        return 1.0 / dtype_tflops(spec.peak_tflops, precision.ffn)
    total_share = sum(PARAMETER_SHARE.values())
    return sum(
        share / total_share / dtype_tflops(spec.peak_tflops, getattr(precision, cls))
        for cls, share in PARAMETER_SHARE.items()
    )


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] by Blom's approximation: Phi^-1((n-0.375)/(n+0.25))."""
    if n <= 1:
        return 0.0
    return _normal_quantile((n - 0.375) / (n + 0.25))


@lru_cache(maxsize=1024)
def _normal_quantile(q: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def ring_allreduce_s(
    size_bytes: float, ranks: int, *, latency_s: float, bandwidth_gbps: float
) -> float:
    """Ring all-reduce: 2(n-1) steps of alpha plus 2(n-1)/n of the bytes over the link."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (ranks - 1) * latency_s + 2 * (ranks - 1) / ranks * size_bytes / (
        bandwidth_gbps * 1e9
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    compute_s: float
    """Forward and backward of one step on the slowest rank, stragglers and bubble in."""
    tp_comm_s: float
    pp_comm_s: float
    sync_s: float
    """Gradient synchronisation across data-parallel ranks, compression kernels in."""
    compress_s: float
    step_s: float
    samples_per_s: float
    bubble: float
    straggler_factor: float
    bytes_sent: float
    """Bytes one data-parallel rank sends per step."""
    dense_bytes: float
    """What a dense all-reduce would have sent."""


def _gradient_width(precision: PrecisionMap, coeffs: Coefficients) -> int:
    """Bytes per gradient element: fp32 in the executor, else 16-bit unless the matmuls
    run in fp32."""
    return 4 if coeffs.executor_reduction or precision.ffn == "fp32" else 2


def _link(shape: Shape, spec: DeviceSpec, coeffs: Coefficients) -> tuple[float, float]:
    """(alpha s, effective GB/s) of the data-parallel ring for this shape."""
    if shape.nodes <= 1:
        return coeffs.intra_latency_s, spec.intra_node_bandwidth_gbps * coeffs.intra_bw_efficiency
    per_node = max(shape.ranks_per_node)
    bandwidth = shape.inter_node_gbps * coeffs.inter_bw_efficiency
    return coeffs.inter_latency_s, bandwidth / per_node**coeffs.node_sharing_exponent


@dataclass(frozen=True, slots=True)
class _NetworkTerms:
    """What a collective between nodes pays beyond its ring formula: the tree latency
    (2 log2(d) steps of ``tree_latency_s``) and the two-node factor. Inside one node,
    nothing."""

    shape: Shape
    ranks: int
    coeffs: Coefficients

    def __call__(self, comm_s: float) -> float:
        if self.shape.nodes <= 1:
            return comm_s
        comm_s += 2 * math.log2(self.ranks) * self.coeffs.tree_latency_s
        if self.shape.nodes == 2:
            comm_s *= self.coeffs.two_node_sync_factor
        return comm_s


def _sync(
    model: ModelProfile,
    config: JobConfig,
    shape: Shape,
    spec: DeviceSpec,
    coeffs: Coefficients,
) -> tuple[float, float, float, float]:
    """(sync s, compress kernel s, bytes sent, dense bytes) of one data-parallel step."""
    layout = config.layout
    elements = model.parameters / (layout.tp * layout.pp)
    width = _gradient_width(config.precision, coeffs)
    executor = coeffs.executor_reduction
    dense = elements * width
    d = layout.dp
    if d <= 1:
        return 0.0, 0.0, 0.0, 0.0
    alpha, gbps = _link(shape, spec, coeffs)
    network = _NetworkTerms(shape, d, coeffs)
    kernel_bw = spec.memory_bandwidth_gbps * 1e9 * KERNEL_BANDWIDTH_EFFICIENCY
    comp: CompressionSpec = config.compression
    dense_sent = 2 * (d - 1) / d * dense
    if comp.kind == "topk":
        assert comp.ratio is not None
        index = EXECUTOR_INDEX_BYTES if executor else INDEX_BYTES
        per_rank = math.ceil(comp.ratio * elements) * (width + index)
        sent = (d - 1) / d * d * per_rank  # all-gather: every rank's k values and indices
        comm = network((d - 1) * alpha + sent / (gbps * 1e9))
        kernel = elements * TOPK_BYTES_PER_ELEMENT / kernel_bw
        kernel += d * per_rank * 2 / kernel_bw  # scatter-add of d ranks' entries
        return comm + kernel, kernel, sent, dense_sent
    if comp.kind in ("int8", "fp8"):
        size = elements * (1 + 4 / 128)
        kernel = elements * QUANT_BYTES_PER_ELEMENT / kernel_bw
        if executor:
            # All-gathered: every rank receives the other d - 1 ranks' codes and
            # dequantises all d of them into fp32.
            sent = (d - 1) * size
            comm = network((d - 1) * alpha + sent / (gbps * 1e9))
            kernel += d * elements * 5 / kernel_bw
            return comm + kernel, kernel, sent, dense_sent
        comm = network(ring_allreduce_s(size, d, latency_s=alpha, bandwidth_gbps=gbps))
        return comm + kernel, kernel, 2 * (d - 1) / d * size, dense_sent
    if comp.kind == "powersgd":
        assert comp.rank is not None
        dim = model.hidden_size or max(1.0, math.sqrt(model.parameters / model.num_layers))
        share = min(1.0, 2 * comp.rank / dim)
        size = dense * share
        comm = network(2 * ring_allreduce_s(size / 2, d, latency_s=alpha, bandwidth_gbps=gbps))
        flops = 4 * elements * comp.rank  # two thin matmuls and their transposes
        kernel = flops / (spec.peak_tflops["fp32"] * 1e12 * 0.3) + 2 * dense / kernel_bw
        return comm + kernel, kernel, 2 * (d - 1) / d * size, dense_sent
    comm = network(ring_allreduce_s(dense, d, latency_s=alpha, bandwidth_gbps=gbps))
    return comm, 0.0, dense_sent, dense_sent


def tp_spans_nodes(layout: Layout, shape: Shape) -> bool:
    """Whether ``layout``'s tensor-parallel groups cross the network where it runs
    (``shape``): they go over the GPUs' link inside a node, where the Planner keeps a
    group, and over the network when a machine holds fewer ranks than the group, as
    machines of one device each do."""
    return layout.tp > 1 and shape.nodes > 1 and min(shape.ranks_per_node) < layout.tp


def step_time(
    model: ModelProfile,
    config: JobConfig,
    shape: Shape,
    global_batch: int,
    *,
    coeffs: Coefficients = DEFAULT_COEFFICIENTS,
    straggler_cv: float = 0.0,
    spec: DeviceSpec | None = None,
) -> StepTime:
    """Time of one optimizer step of ``global_batch`` samples (see the module docstring).
    ``spec`` replaces the catalog's entry for ``shape.gpu_model`` (a calibrated device)."""
    layout = config.layout
    if shape.world_size != layout.world_size:
        raise ValueError(
            f"placement has {shape.world_size} ranks, layout needs {layout.world_size}"
        )
    spec = spec or device(shape.gpu_model)
    share = shape.gpu_milli / MILLI_PER_GPU
    flops = model.flops_per_sample * global_batch / layout.world_size
    seconds = flops / 1e12 * class_time_factor(spec, model, config.precision) / coeffs.mfu
    if coeffs.batch_exponent != 1:
        micro_samples = global_batch / (layout.dp * layout.micro_batches)
        seconds *= micro_samples ** (coeffs.batch_exponent - 1)
    seconds /= share * balance_gain(shape, model, config, spec)
    if layout.activation_checkpointing:
        seconds *= RECOMPUTE_FACTOR
    bubble = pipeline_bubble(layout.pp, layout.micro_batches)
    seconds /= 1 - bubble
    straggler = 1 + straggler_cv * expected_max_normal(layout.world_size)
    compute = seconds * straggler + coeffs.compute_overhead_s

    micro = max(1.0, global_batch / (layout.dp * layout.micro_batches))
    act_width = 4 if config.precision.ffn == "fp32" else 2
    message = micro * model.seq_len * max(model.hidden_size, 1) * act_width
    tp_comm = 0.0
    if layout.tp > 1 and model.hidden_size:
        spans = tp_spans_nodes(layout, shape)
        per = ring_allreduce_s(
            message,
            layout.tp,
            latency_s=(
                (coeffs.tp_latency_s or coeffs.inter_latency_s) if spans else coeffs.intra_latency_s
            ),
            bandwidth_gbps=(
                shape.inter_node_gbps * coeffs.inter_bw_efficiency
                if spans
                else spec.intra_node_bandwidth_gbps * coeffs.intra_bw_efficiency
            ),
        )
        tp_comm = 4 * model.num_layers / layout.pp * layout.micro_batches * per
    pp_comm = 0.0
    if layout.pp > 1:
        boundary = (
            message
            if model.hidden_size
            else micro * model.activation_bytes_per_sample / model.num_layers * act_width / 2
        )
        gbps = (
            shape.inter_node_gbps * coeffs.inter_bw_efficiency
            if shape.nodes > 1
            else spec.intra_node_bandwidth_gbps * coeffs.intra_bw_efficiency
        )
        pp_comm = 2 * layout.micro_batches * (boundary / layout.tp / (gbps * 1e9))
    compute += tp_comm + pp_comm

    sync, kernel, sent, dense = _sync(model, config, shape, spec, coeffs)
    overlapped = not coeffs.executor_reduction or config.compression.kind in OVERLAPPED
    g = coeffs.overlap_gamma if overlapped else 1.0
    step = (compute**g + sync**g) ** (1 / g) if sync > 0 else compute
    return StepTime(
        compute_s=compute,
        tp_comm_s=tp_comm,
        pp_comm_s=pp_comm,
        sync_s=sync,
        compress_s=kernel,
        step_s=step,
        samples_per_s=global_batch / step,
        bubble=bubble,
        straggler_factor=straggler,
        bytes_sent=sent,
        dense_bytes=dense,
    )


def _per_sample(noise_scale: float, reference_batch: int, batch: int) -> float:
    """(phi + M0) / (phi + M): a sample's progress at batch M relative to M0 (Pollux,
    Qiao et al. OSDI'21, eq. 5; McCandlish et al. 2018); 1 when phi is unknown (0)."""
    if noise_scale <= 0:
        return 1.0
    return (noise_scale + reference_batch) / (noise_scale + batch)


def batch_gain(noise_scale: float, reference_batch: int, batch: int) -> float:
    """Progress per step at ``batch`` (M) relative to a step at ``reference_batch`` (M0):
    r = (M / M0) (phi + M0) / (phi + M), phi the gradient noise scale in samples; M / M0
    when phi is unknown (0). The progress holds where the step's learning rate is scaled
    by r, as AdaScale does (Johnson et al. 2020); the executor does so for a batch above
    the one the job's learning rate was tuned for (``autotune.executor.quality.
    BatchScaling``)."""
    return batch / reference_batch * _per_sample(noise_scale, reference_batch, batch)


def batch_efficiency(model: ModelProfile, global_batch: int) -> float:
    """Progress per sample at batch M relative to M0 = ``reference_batch``: a step's gain
    (``batch_gain``) over the samples it takes, (phi + M0) / (phi + M). 1 when phi is
    unknown (0)."""
    return _per_sample(model.noise_scale, model.reference_batch, global_batch)


def compression_efficiency(spec: CompressionSpec, model: ModelProfile | None = None) -> float:
    """Progress per sample under gradient compression relative to dense SGD: what was
    measured of ``model`` under ``spec`` (``ModelProfile.compression_efficiency``), else
    the price of ``model``'s sensitivity (``ModelProfile.compression_sensitivity``), else
    the catalog's (``CATALOG_SENSITIVITY``; int8 and fp8 a constant)."""
    if spec.kind == "none":
        return 1.0
    if model is not None and model.compression_efficiency:
        measured = dict(model.compression_efficiency).get(str(spec))
        if measured is not None:
            return measured
    if spec.kind in _QUANTIZED_EFFICIENCY:
        return _QUANTIZED_EFFICIENCY[spec.kind]
    sensitivity = (model.compression_sensitivity if model is not None else None) or (
        CATALOG_SENSITIVITY
    )
    if spec.kind == "powersgd":
        assert spec.rank is not None
        penalty = sensitivity.powersgd * 4 / spec.rank
    else:
        assert spec.ratio is not None
        penalty = sensitivity.topk * math.log10(1 / spec.ratio) ** 2
    return max(MIN_COMPRESSION_EFFICIENCY, 1 - penalty)


def _shares(precision: PrecisionMap) -> dict[Precision, float]:
    total = sum(PARAMETER_SHARE.values())
    out: dict[Precision, float] = {}
    for cls, share in PARAMETER_SHARE.items():
        dtype: Precision = getattr(precision, cls)
        out[dtype] = out.get(dtype, 0.0) + share / total
    return out


def precision_efficiency(precision: PrecisionMap) -> float:
    """Progress per sample under a precision map relative to fp32."""
    return 1 - sum(_PRECISION_PENALTY[dtype] * s for dtype, s in _shares(precision).items())


def divergence_rate_per_hour(model: ModelProfile, precision: PrecisionMap) -> float:
    """Expected NaN/Inf events per hour of training: the model's sensitivity times the
    share-weighted risk of its low-precision classes; a norm below fp32 triples it."""
    risk = sum(_DIVERGENCE_RISK[dtype] * s for dtype, s in _shares(precision).items())
    if precision.norm != "fp32":
        risk *= 3
    return model.precision_sensitivity * risk


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    step: StepTime
    goodput: float
    """Samples/s times statistical efficiency: progress in reference-batch samples/s."""
    efficiency: float
    memory_bytes: float
    oom: bool
    power_watts: float
    """All the job's GPUs together."""
    divergence_per_hour: float


def statistical_efficiency(
    model: ModelProfile | None, config: JobConfig, global_batch: int
) -> float:
    """Progress per sample relative to the reference run, in (0, 1]: the batch's (Pollux),
    the compression's and the precision's efficiencies multiplied. Goodput is throughput
    times this. A model whose profile is unknown (a user's module task) is charged for its
    compression and precision only."""
    if model is None:
        return compression_efficiency(config.compression) * precision_efficiency(config.precision)
    return (
        batch_efficiency(model, global_batch)
        * compression_efficiency(config.compression, model)
        * precision_efficiency(config.precision)
    )


def estimate(
    model: ModelProfile,
    config: JobConfig,
    shape: Shape,
    global_batch: int,
    *,
    coeffs: Coefficients = DEFAULT_COEFFICIENTS,
    straggler_cv: float = 0.0,
) -> Estimate:
    """Everything the simulator and the policies need about one job under one config."""
    step = step_time(model, config, shape, global_batch, coeffs=coeffs, straggler_cv=straggler_cv)
    share = shape.gpu_milli / MILLI_PER_GPU
    memory, oom, tdp = 0.0, False, 0.0
    for gpu_model, ranks, batch in rank_batches(shape, model, config, global_batch):
        spec = device(gpu_model)
        used = rank_memory(model, config, batch).total_bytes
        memory = max(memory, used)
        oom = oom or used > spec.memory_bytes * share
        tdp += spec.tdp_watts * ranks
    efficiency = statistical_efficiency(model, config, global_batch)
    busy = min(1.0, step.compute_s / step.step_s) if step.step_s > 0 else 0.0
    watts = tdp * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION) * busy)
    return Estimate(
        step=step,
        goodput=0.0 if oom else step.samples_per_s * efficiency,
        efficiency=efficiency,
        memory_bytes=memory,
        oom=oom,
        power_watts=watts * share,
        divergence_per_hour=divergence_rate_per_hour(model, config.precision),
    )


def rank_batches(
    shape: Shape, model: ModelProfile, config: JobConfig, global_batch: int
) -> list[tuple[str, int, int]]:
    """``(GPU model, ranks, batch)`` per model of ``shape``, ``batch`` being the global
    batch under which an even share equals what one of its ranks takes: ``global_batch``
    on one model; by speed on several (``balanced``), where a fast rank's larger share
    needs more activation memory."""
    if not shape.mixed:
        return [(shape.gpu_model, shape.world_size, global_batch)]
    if not (shape.balanced and balanced(config)):
        return [(m, n, global_batch) for m, n in shape.gpu_models]
    speeds = {m: rank_speed(m, model, config.precision) for m, _ in shape.gpu_models}
    total = sum(speeds[m] * n for m, n in shape.gpu_models)
    return [
        (m, n, max(1, round(global_batch * shape.world_size * speeds[m] / total)))
        for m, n in shape.gpu_models
    ]
