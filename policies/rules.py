"""The rule-based policy: transparent rules a reader can check against the log.

For every pending job, in queue order:

1. **GPUs.** Its fair share of the free GPUs of the models it may use (free GPUs / jobs
   waiting for them), clamped to ``[min_gpus, max_gpus]``, rounded down to a power of
   two (layouts and all-reduce rings like powers of two), and no more than one GPU
   model can hold on ``max_nodes`` nodes (the Planner keeps a job on one model);
   doubled while no layout of that many GPUs fits in memory (up to ``max_gpus``, the
   free GPUs and that gang), so that a long queue cannot shrink a big model's share
   below what it needs.
2. **Precision.** The narrowest precision every candidate GPU model runs natively:
   bf16 if all have bf16 units, else fp16 (with dynamic loss scaling) if all have fast
   fp16, else fp32. Norms and optimizer state stay fp32.
3. **Layout.** The first of: data parallel; tensor parallel 2, 4, 8 within a node; then
   pipeline stages; whose rank fits the smallest candidate GPU under the decision step's
   memory rule (gradient accumulation, then activation checkpointing:
   ``autotune.perf.memory.fit_memory``). Pipelines run at least ``2 x pp`` micro-batches
   (bubble <= 1/3).
4. **Compression.** int8 blockwise quantisation when the job cannot fit in one node of
   its candidates (its gradients then cross the network: each rank's codes are a
   quarter of its fp32 gradient, but the executor all-gathers them, so the replicas
   receive fewer bytes than a dense ring's only below 8 of them) and has more than
   100 M parameters; otherwise none.

Running jobs keep their configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune import __version__
from autotune.core import (
    MILLI_PER_GPU,
    CompressionSpec,
    JobConfig,
    JobSpec,
    Layout,
    NodeInfo,
    Precision,
    PrecisionMap,
    fast_precisions,
)
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.perf.memory import fit_layout
from autotune.planner import largest_gang

__all__ = ["RulesPolicy", "candidate_nodes", "first_fitting_layout", "free_gpus"]

# Compress only jobs big enough for the all-reduce to matter: at 100 M parameters a
# dense fp32 all-reduce moves 0.8 GB per step, 64 ms at 12.5 GB/s.
_COMPRESS_MIN_PARAMETERS = 100_000_000


@dataclass(frozen=True, slots=True)
class _Candidates:
    nodes: list[NodeInfo]
    free_gpus: int

    @property
    def min_memory_bytes(self) -> int:
        return min(n.gpu_memory_bytes for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max(n.gpu_count for n in self.nodes)


def _power_of_two_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


class RulesPolicy:
    """``Policy`` of transparent rules; see the module docstring."""

    name = "rules"

    def __init__(self) -> None:
        self.version = f"rules-{__version__}"

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        pending = sorted(
            snapshot.by_state("pending"), key=lambda j: (-j.spec.priority, j.spec.submitted_at)
        )
        if not pending:
            return PolicyRound(choices={})
        free = free_gpus(snapshot)
        choices: dict[str, PolicyChoice] = {}
        for status in pending:
            candidates = candidate_nodes(status.spec, snapshot.nodes, free)
            if candidates is None:
                continue  # no allowed GPU model in the cluster: the Planner says so
            waiting = sum(
                1
                for other in pending
                if any(other.spec.allows(n.gpu_model) for n in candidates.nodes)
            )
            choices[status.spec.job_id] = _choose(status.spec, candidates, waiting)
        return PolicyRound(choices=choices)


def free_gpus(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Whole free GPUs per node."""
    used: dict[tuple[str, int], int] = {}
    for job in snapshot.by_state("running"):
        if job.placement is not None:
            for slot in job.placement.ranks:
                key = (slot.node_id, slot.gpu_index)
                used[key] = used.get(key, 0) + slot.gpu_milli
    return {
        n.node_id: sum(1 for g in range(n.gpu_count) if used.get((n.node_id, g), 0) == 0)
        for n in snapshot.nodes
    }


def candidate_nodes(
    spec: JobSpec, nodes: Sequence[NodeInfo], free: dict[str, int]
) -> _Candidates | None:
    allowed = [n for n in nodes if n.gpu_count > 0 and spec.allows(n.gpu_model)]
    if not allowed:
        return None
    return _Candidates(nodes=allowed, free_gpus=sum(free[n.node_id] for n in allowed))


def _choose(spec: JobSpec, candidates: _Candidates, waiting: int) -> PolicyChoice:
    share = candidates.free_gpus // max(1, waiting)
    gpus = max(spec.min_gpus, min(spec.max_gpus, share))
    if spec.gpu_milli < MILLI_PER_GPU:
        gpus = 1
    gpus = max(spec.min_gpus, _power_of_two_floor(gpus))
    why_gpus = (
        f"{gpus} GPU(s): fair share of {candidates.free_gpus} free over {waiting} waiting job(s), "
        f"within [{spec.min_gpus}, {spec.max_gpus}]"
    )
    # The Planner runs a job's ranks on one GPU model, on at most max_nodes nodes: more
    # than one model's largest such gang could hold would wait for ever.
    gang = largest_gang(spec, candidates.nodes)
    if gpus > gang >= spec.min_gpus:
        gpus = max(spec.min_gpus, _power_of_two_floor(gang))
        why_gpus += f"; lowered to {gpus}: one GPU model holds at most {gang} of its ranks"
    precision, why_precision = _precision(candidates.nodes)
    layout, why_layout, fits = first_fitting_layout(spec, gpus, precision, candidates)
    # A fair share too small for the model would keep it waiting for ever (and the
    # queue with it): take the smallest power of two within its bounds that fits.
    ceiling = min(spec.max_gpus, max(candidates.free_gpus, gpus), max(gang, spec.min_gpus))
    while not fits and gpus * 2 <= ceiling:
        gpus *= 2
        layout, why_layout, fits = first_fitting_layout(spec, gpus, precision, candidates)
        if fits:
            why_gpus += f"; raised to {gpus}, the fewest on which a layout fits"
    compression, why_compression = _compression(spec, gpus, candidates)
    config = JobConfig(layout=layout, precision=precision, compression=compression)
    return PolicyChoice(
        config=config,
        reason="; ".join((why_gpus, why_precision, why_layout, why_compression)),
        features={
            "free_gpus": float(candidates.free_gpus),
            "waiting_jobs": float(waiting),
            "min_gpu_memory_gib": candidates.min_memory_bytes / (1 << 30),
        },
    )


def _precision(nodes: Sequence[NodeInfo]) -> tuple[PrecisionMap, str]:
    models = sorted({n.gpu_model for n in nodes})
    peaks = [n.peak_tflops for n in nodes]
    chosen: Precision
    if all("bf16" in fast_precisions(p) for p in peaks):
        chosen, why = "bf16", "all candidate GPUs have bf16 units faster than fp32"
    elif all(p.get("fp16", 0) > 2 * p.get("fp32", 0) for p in peaks):
        chosen, why = "fp16", "fp16 with loss scaling: not every candidate GPU has bf16"
    else:
        chosen, why = "fp32", "fp32: not every candidate GPU has fast 16-bit units"
    return PrecisionMap.uniform(chosen), f"{chosen} on {'/'.join(models)} ({why})"


def first_fitting_layout(
    spec: JobSpec, gpus: int, precision: PrecisionMap, candidates: _Candidates
) -> tuple[Layout, str, bool]:
    """The first layout of ``gpus`` ranks that fits the smallest candidate GPU
    (``autotune.perf.memory.fit_layout``), why, and whether one fits (else plain data
    parallelism, which does not)."""
    if spec.model is None:
        return Layout(world_size=gpus), f"dp={gpus} (opaque job: no model profile)", True
    memory = candidates.min_memory_bytes * spec.gpu_milli / MILLI_PER_GPU
    config = JobConfig(layout=Layout(world_size=gpus), precision=precision)
    fitted, estimate, tried = fit_layout(
        spec.model, config, spec.global_batch, memory, max_tp=candidates.max_gpus_per_node
    )
    layout = fitted.layout
    label = f"dp={layout.dp} tp={layout.tp} pp={layout.pp}"
    if not estimate.fits(int(memory)):
        return (
            Layout(world_size=gpus),
            f"no layout of {gpus} GPU(s) fits {memory / (1 << 30):.0f} GiB: "
            f"{', '.join([*tried, label])}",
            False,
        )
    if layout.pp == 1 and layout.micro_batches > 1:
        label += f" accum={layout.micro_batches}"
    if layout.activation_checkpointing:
        label += " +ckpt"
    skipped = f" (too big: {', '.join(tried)})" if tried else ""
    return (
        layout,
        f"{label}: {estimate.total_bytes / (1 << 30):.1f} GiB per rank fits "
        f"{memory / (1 << 30):.0f} GiB{skipped}",
        True,
    )


def _compression(spec: JobSpec, gpus: int, candidates: _Candidates) -> tuple[CompressionSpec, str]:
    spans_nodes = gpus > candidates.max_gpus_per_node
    big = spec.model is not None and spec.model.parameters > _COMPRESS_MIN_PARAMETERS
    if spans_nodes and big:
        return CompressionSpec(kind="int8"), "int8 gradients: the all-reduce crosses nodes"
    if spans_nodes:
        return CompressionSpec(), "no compression: too few parameters to pay off"
    return CompressionSpec(), "no compression: fits in one node"
