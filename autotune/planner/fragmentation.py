"""The fragmentation cost term (FGD, Weng et al., "Beware of Fragmentation", USENIX
ATC 2023): of a node's free GPU capacity, what a request drawn from the pending
workload's typical request shapes (``WorkloadClasses``) could not use, and its growth
when a unit is placed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from autotune.core import MILLI_PER_GPU
from autotune.planner.arrays import BoolArray, FloatArray, IntArray
from autotune.planner.jobs import PreparedJob

# Workload classes kept for the fragmentation measure: the 64 largest request shapes
# hold 82% (gpuspec33, 405 shapes) to 98% (the other Alibaba v2023 pod files, about
# 115 shapes) of the pending GPU demand.
_MAX_CLASSES: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadClasses:
    """The request shapes of the pending workload and how common each is."""

    gpus: IntArray
    milli: IntArray
    cpu: IntArray
    mem: IntArray
    allowed: BoolArray
    """(classes, models): which GPU models each class may use."""
    weight: FloatArray
    """Share of the pending GPU demand; sums to 1. Weighting by GPUs rather than by
    pod count keeps 8-GPU requests in view: on ``gpuspec33`` the count weighting left 18
    eight-GPU pods unplaced and allocated 5,695 GPUs; the GPU weighting, 5,812."""


def workload_classes(jobs: Sequence[PreparedJob], n_models: int) -> WorkloadClasses:
    counts: dict[tuple[int, int, int, int, bytes], float] = {}
    masks: dict[bytes, BoolArray] = {}
    for job in jobs:
        # Host requests rounded up to 1 core and 1 GiB so near-identical pods share a class.
        gpus, milli, cpu, mem = job.shape
        mask = job.allowed.tobytes()
        key = (gpus, milli, -(-cpu // 1000) * 1000, -(-mem // 1024) * 1024, mask)
        if mask not in masks:
            masks[mask] = job.allowed
        counts[key] = counts.get(key, 0) + job.units * gpus * milli
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:_MAX_CLASSES]
    if not top:
        top = [((1, MILLI_PER_GPU, 0, 0, b""), 1)]
    total = sum(c for _, c in top)
    return WorkloadClasses(
        gpus=np.array([k[0] for k, _ in top], dtype=np.int64),
        milli=np.array([k[1] for k, _ in top], dtype=np.int64),
        cpu=np.array([k[2] for k, _ in top], dtype=np.int64),
        mem=np.array([k[3] for k, _ in top], dtype=np.int64),
        allowed=np.array(
            [masks[k[4]] if k[4] else np.ones(n_models, dtype=bool) for k, _ in top],
            dtype=bool,
        ).reshape(len(top), n_models),
        weight=np.array([c / total for _, c in top]),
    )


def class_terms(
    free_milli: IntArray, classes: WorkloadClasses
) -> tuple[IntArray, IntArray, IntArray]:
    """Per node state and class: GPUs with enough free milli for the class, the free
    milli of the others (the fragments), and the node's total free milli."""
    free = np.clip(free_milli, 0, None)
    usable = free[:, None, :] >= classes.milli[None, :, None]  # (K, M, G)
    fragment = np.where(usable, 0, free[:, None, :]).sum(axis=2)
    return usable.sum(axis=2), fragment, free.sum(axis=1)


def expected_fragment(
    usable: IntArray,
    fragment: IntArray,
    total: IntArray,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
    classes: WorkloadClasses,
) -> FloatArray:
    """Expected fragment over the classes; leading axes broadcast, classes last.
    ``usable`` and ``fragment`` carry the class axis; ``total``, ``cpu``, ``mem`` and
    ``model`` do not."""
    fits = (
        (usable >= classes.gpus)
        & (cpu[..., None] >= classes.cpu)
        & (mem[..., None] >= classes.mem)
        & classes.allowed.T[model]
    )
    per_class = np.where(fits, fragment, total[..., None])
    result: FloatArray = per_class.astype(np.float64) @ classes.weight
    return result


def fragmentation(
    free_milli: IntArray, cpu: IntArray, mem: IntArray, model: IntArray, classes: WorkloadClasses
) -> FloatArray:
    """Expected GPU capacity (milli) of each of K node states, (K, G) -> (K,), that a
    request drawn from the workload classes could not use.

    For a class the node can host (model allowed, enough GPUs with the free milli it
    asks per GPU, enough CPU and memory), the GPUs with less free than that are
    fragments; for a class it cannot host, all its free GPU capacity is.

    The measure's definition in one call; the cost model computes it in parts, the
    class terms kept per node (``class_terms``) and then ``expected_fragment``.
    """
    return expected_fragment(*class_terms(free_milli, classes), cpu, mem, model, classes)


def fragmentation_one_gpu(
    free_milli: IntArray,
    terms: tuple[IntArray, IntArray, IntArray],
    milli: int,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
    classes: WorkloadClasses,
) -> FloatArray:
    """``fragmentation`` of each node after ``milli`` is taken from each of its GPUs in
    turn, (K, G) -> (K, G), updating the node's class terms (``class_terms``) for the
    one GPU that changes instead of recounting all of them."""
    usable, fragment, total = terms
    before = np.clip(free_milli, 0, None)[:, :, None]  # (K, G, 1)
    after = before - milli
    was = before >= classes.milli
    now = after >= classes.milli
    return expected_fragment(
        usable[:, None, :] - was + now,
        fragment[:, None, :] - np.where(was, 0, before) + np.where(now, 0, after),
        (total - milli)[:, None],
        cpu[:, None],
        mem[:, None],
        model[:, None],
        classes,
    )
