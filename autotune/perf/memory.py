"""GPU memory of one rank for a model, a layout and a precision map.

The Planner uses this to refuse a configuration that would run out of memory before it
places anything. Terms, per rank, in bytes (P = parameters, t/p/d = tp/pp/dp degree):

- weights     = P/(t*p) * sum_c share_c * bytes(precision_c)
- master      = P/(t*p) * sum_c share_c * 4   for classes below fp32: the fp32 master copy
                mixed-precision training keeps (Micikevicius et al., ICLR 2018)
- gradients   = P/(t*p) * sum_c share_c * max(bytes(precision_c), 2): gradients of fp8
                matmuls are produced in 16-bit (DeepSeek-V3 report, section 3.3)
- optimizer   = P/(t*p) * 2 * bytes(optimizer_state): Adam's two moments
- activations = A * s * m * f / (t*p), with A the profile's activation bytes per sample
                (16-bit), s = bytes(ffn precision)/2, m the micro-batch size
                ceil(global_batch / (d * micro_batches)), f the micro-batches in flight on
                a stage (1 without pipelining; min(p, micro_batches) under 1F1B)
- checkpointed activations keep 2 of the 34 s*b*h bytes per layer that a transformer
  layer stores (Korthikanti et al., "Reducing Activation Recomputation", 2022, table 2),
  plus one layer recomputed in full: A*s*m*(f*2/34/(t*p) + 1/(L*t))
- runtime     = 1 GiB: CUDA context, cuBLAS/NCCL workspaces and allocator slack

Embedding and head sit on the first and last pipeline stage; spreading them evenly is
the approximation here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from autotune.core import MILLI_PER_GPU, JobConfig, Layout, ModelProfile, Precision

__all__ = [
    "BYTES_PER_ELEMENT",
    "MAX_MICRO_BATCHES",
    "PARAMETER_SHARE",
    "MemoryEstimate",
    "fit_layout",
    "fit_memory",
    "rank_memory",
]

BYTES_PER_ELEMENT: Final[dict[Precision, int]] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

# Share of a GPT-style model's parameters per module class, from a 1.3B GPT (hidden
# 2048, 24 layers, vocabulary 50,257, untied head): each block has 3h^2 QKV, h^2 output
# and 8h^2 feed-forward weights; embedding and head are 7% each; norms are negligible.
PARAMETER_SHARE: Final[dict[str, float]] = {
    "embedding": 0.07,
    "attention_qkv": 0.215,
    "attention_out": 0.0717,
    "ffn": 0.5731,
    "norm": 0.0002,
    "head": 0.07,
}

# Korthikanti et al. 2022: a transformer layer stores 34*s*b*h bytes of activations
# (plus attention scores); full recomputation keeps only its 2*s*b*h input.
CHECKPOINT_KEPT_FRACTION: Final = 2 / 34

RUNTIME_OVERHEAD_BYTES: Final = 1 << 30
ADAM_MOMENTS: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    weights_bytes: float
    master_weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    runtime_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.master_weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.runtime_bytes
        )

    def fits(self, gpu_memory_bytes: int, gpu_milli: int = MILLI_PER_GPU) -> bool:
        """Whether the rank fits its share of a GPU (a fraction gets that fraction)."""
        return self.total_bytes <= gpu_memory_bytes * gpu_milli / MILLI_PER_GPU

    def describe(self) -> str:
        gib = float(1 << 30)
        return (
            f"{self.total_bytes / gib:.1f} GiB per rank (weights {self.weights_bytes / gib:.1f}"
            f" + master {self.master_weights_bytes / gib:.1f}"
            f" + grads {self.gradients_bytes / gib:.1f}"
            f" + optimizer {self.optimizer_bytes / gib:.1f}"
            f" + activations {self.activations_bytes / gib:.1f}"
            f" + runtime {self.runtime_bytes / gib:.1f})"
        )


def rank_memory(model: ModelProfile, config: JobConfig, global_batch: int) -> MemoryEstimate:
    """Peak memory of the busiest rank of a job trained under ``config``."""
    layout, precision = config.layout, config.precision
    shard = layout.tp * layout.pp
    params = model.parameters / shard
    weights = master = grads = 0.0
    for module_class, share in PARAMETER_SHARE.items():
        dtype: Precision = getattr(precision, module_class)
        width = BYTES_PER_ELEMENT[dtype]
        weights += params * share * width
        grads += params * share * max(width, 2)
        if dtype != "fp32":
            master += params * share * BYTES_PER_ELEMENT["fp32"]
    optimizer = params * ADAM_MOMENTS * BYTES_PER_ELEMENT[precision.optimizer_state]

    micro_batch = math.ceil(global_batch / (layout.dp * layout.micro_batches))
    in_flight = 1 if layout.pp == 1 else min(layout.pp, layout.micro_batches)
    per_micro_batch = (
        model.activation_bytes_per_sample * BYTES_PER_ELEMENT[precision.ffn] / 2 * micro_batch
    )
    if layout.activation_checkpointing:
        activations = per_micro_batch * (
            in_flight * CHECKPOINT_KEPT_FRACTION / shard + 1 / (model.num_layers * layout.tp)
        )
    else:
        activations = per_micro_batch * in_flight / shard
    return MemoryEstimate(
        weights_bytes=weights,
        master_weights_bytes=master,
        gradients_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        runtime_bytes=RUNTIME_OVERHEAD_BYTES,
    )


MAX_MICRO_BATCHES: Final = 64
"""Most micro-batches (gradient accumulation steps) the memory rule adds."""


def fit_memory(
    model: ModelProfile, config: JobConfig, global_batch: int, memory_bytes: float
) -> tuple[JobConfig, MemoryEstimate]:
    """The memory rule: the config a rank of ``model`` needs to fit ``memory_bytes``, and
    its estimate. Unchanged when it fits; otherwise more micro-batches (gradient
    accumulation, or pipeline micro-batches), doubling while a micro-batch keeps at least
    one sample and up to ``MAX_MICRO_BATCHES``; then the same with activation
    checkpointing. The first that fits is returned; when none does, the last tried (the
    Planner then says how much it needs). Layout degrees, precision and compression are
    never changed: they are the policy's to choose."""
    estimate = rank_memory(model, config, global_batch)
    if estimate.fits(int(memory_bytes)):
        return config, estimate
    layout = config.layout
    per_rank = max(1, global_batch // layout.dp)
    tried = (config, estimate)
    for checkpointing in sorted({layout.activation_checkpointing, True}):
        micro = layout.micro_batches
        while True:
            candidate = replace(
                config,
                layout=replace(layout, micro_batches=micro, activation_checkpointing=checkpointing),
            )
            estimate = rank_memory(model, candidate, global_batch)
            if estimate.fits(int(memory_bytes)):
                return candidate, estimate
            tried = (candidate, estimate)
            if micro * 2 > min(per_rank, MAX_MICRO_BATCHES):
                break
            micro *= 2
    return tried


def fit_layout(
    model: ModelProfile, config: JobConfig, global_batch: int, memory_bytes: float, *, max_tp: int
) -> tuple[JobConfig, MemoryEstimate, list[str]]:
    """The first layout of ``config``'s world size whose rank fits ``memory_bytes`` under
    the memory rule (``fit_memory``), in this order: data parallel; tensor parallel 2, 4,
    8 (within a node: at most ``max_tp``); then the largest of those with 2, 4, 8
    pipeline stages (each with at least 2 x stages micro-batches). Precision and
    compression stay ``config``'s. Returns the config, its estimate and the layouts
    tried before it (``dp=.. tp=.. pp=..``); when none fits, the last tried."""
    gpus = config.world_size
    options: list[tuple[int, int]] = [(1, 1)]
    options += [(tp, 1) for tp in (2, 4, 8) if gpus % tp == 0 and tp <= max_tp]
    best_tp = max(tp for tp, _ in options)
    options += [
        (best_tp, pp) for pp in (2, 4, 8) if gpus % (best_tp * pp) == 0 and pp <= model.num_layers
    ]
    tried: list[str] = []
    for tp, pp in options:
        layout = Layout(world_size=gpus, tp=tp, pp=pp, micro_batches=2 * pp if pp > 1 else 1)
        fitted, estimate = fit_memory(
            model, replace(config, layout=layout), global_batch, memory_bytes
        )
        if estimate.fits(int(memory_bytes)):
            return fitted, estimate, tried
        tried.append(f"dp={fitted.layout.dp} tp={tp} pp={pp}")
    return fitted, estimate, tried[:-1]
