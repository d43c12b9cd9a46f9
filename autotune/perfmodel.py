"""Performance model: how fast a job trains under a config and placement.

This holds the compute-bound part, which the Planner and the built-in simulated cluster
use; communication (alpha-beta all-reduce), stragglers and statistical efficiency are
not modelled here yet, so these figures are upper bounds for jobs that span nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from autotune.core import JobConfig, ModelProfile, NodeInfo, Placement, PrecisionMap

__all__ = ["MFU", "compute_bound_samples_per_s", "effective_peak_tflops", "pipeline_bubble"]

# Model FLOPs utilisation of a well-tuned dense training step. Megatron-LM reaches 52% of
# peak for GPT-3 175B on A100s (Narayanan et al., SC'21, table 1); PaLM 46% on TPU v4
# (Chowdhery et al. 2022, table 3). 40% leaves room for smaller, less efficient jobs.
MFU: Final = 0.40


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
