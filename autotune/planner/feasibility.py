"""Feasibility (step 1): for every job and GPU model, whether the model is allowed and
one rank fits its share of the GPU's memory, with the job's per-model cost terms
(compute fit, memory headroom) and its first unit size; or the reason no model can
hold it. Jobs of equal requests share the work, and so do successive plans on one
cluster."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Final

import numpy as np

from autotune.core import MILLI_PER_GPU, JobConfig, JobSpec, NodeInfo, node_table
from autotune.perf.memory import rank_memory
from autotune.perf.model import effective_peak_tflops
from autotune.planner.arrays import BoolArray, FloatArray
from autotune.planner.capacity import FreeCapacity
from autotune.planner.jobs import PreparedJob, block_sizes

# The 90% line of GPU memory: above it a rank is one allocator spike from OOM.
_HEADROOM_LINE: Final = 0.9


_Prepared = tuple[BoolArray, FloatArray, FloatArray, int, int]
"""allowed, compute, headroom, first block size, terms id (``PreparedJob.terms_id``)."""


class _Preparer:
    """``_assess`` with the work shared between jobs of equal requests: jobs that
    differ only in id, priority and submission time get the same answer."""

    def __init__(self, state: FreeCapacity) -> None:
        self.state = state
        self._results: dict[Hashable, _Prepared | str] = {}
        self._type_ok: dict[tuple[str, ...] | None, BoolArray] = {}
        self._hostable: dict[tuple[int, int, int], BoolArray] = {}
        self._terms_ids: dict[tuple[bytes, bytes, bytes], int] = {}
        self._data_parallel: dict[int, JobConfig] = {}

    def config(self, spec: JobSpec, configs: Mapping[str, JobConfig]) -> JobConfig:
        config = configs.get(spec.job_id)
        if config:
            return config
        found = self._data_parallel.get(spec.min_gpus)
        if found is None:
            found = self._data_parallel[spec.min_gpus] = JobConfig.data_parallel(spec.min_gpus)
        return found

    def prepare(self, spec: JobSpec, config: JobConfig) -> tuple[PreparedJob | None, str]:
        key: Hashable = (
            spec.model,
            spec.global_batch if spec.model is not None else 0,
            spec.min_gpus,
            spec.max_gpus,
            spec.gpu_milli,
            spec.gpu_types,
            spec.max_nodes,
            spec.cpu_milli,
            spec.memory_mib,
            config,
        )
        try:
            found = self._results.get(key)
        except TypeError:  # an unhashable field: no sharing
            key, found = None, None
        if found is None:
            found = self._assess(spec, config)
            if key is not None:
                if len(self._results) > 100_000:
                    self._results.clear()
                self._results[key] = found
        if isinstance(found, str):
            return None, found
        allowed, compute, headroom, block, terms_id = found
        job = PreparedJob(
            spec=spec,
            config=config,
            allowed=allowed,
            compute=compute,
            headroom=headroom,
            block=block,
            terms_id=terms_id,
        )
        return job, ""

    def type_ok(self, gpu_types: tuple[str, ...] | None) -> BoolArray:
        found = self._type_ok.get(gpu_types)
        if found is None:
            models = self.state.models
            if gpu_types is None:
                found = np.ones(len(models), dtype=bool)
            else:
                found = np.array([m in gpu_types for m in models], dtype=bool)
            self._type_ok[gpu_types] = found
        return found

    def hostable(self, block: int, cpu: int, mem: int) -> BoolArray:
        """Per model: some node of it has ``block`` GPUs, ``cpu`` and ``mem``."""
        key = (block, cpu, mem)
        found = self._hostable.get(key)
        if found is None:
            s = self.state
            fits = (
                s.gpu_nodes
                & (s.capacity_gpus >= block)
                & (s.capacity_cpu >= cpu)
                & (s.capacity_mem >= mem)
            )
            found = np.zeros(len(s.models), dtype=bool)
            found[s.model_of[fits]] = True
            self._hostable[key] = found
        return found

    def _assess(self, spec: JobSpec, config: JobConfig) -> _Prepared | str:
        """The job's per-model feasibility and cost terms, or the reason it cannot be
        placed. Per-model figures (memory, peak) come from the first node of each model."""
        state = self.state
        world = config.world_size
        if not spec.min_gpus <= world <= spec.max_gpus:
            return f"config asks for {world} GPUs, the job allows {spec.min_gpus}-{spec.max_gpus}"
        representative = state.representative
        type_ok = self.type_ok(spec.gpu_types)
        if not type_ok.any():
            if spec.gpu_types is None:
                return "the cluster has no GPU nodes"
            return f"no node has an allowed GPU model ({', '.join(spec.gpu_types)})"
        compute = np.zeros(len(state.models))
        headroom = np.zeros(len(state.models))
        memory_ok = np.ones(len(state.models), dtype=bool)
        if spec.model is not None:
            estimate = rank_memory(spec.model, config, config.batch(spec))
            for i, node in enumerate(representative):
                share = node.gpu_memory_bytes * spec.gpu_milli / MILLI_PER_GPU
                memory_ok[i] = estimate.fits(node.gpu_memory_bytes, spec.gpu_milli)
                headroom[i] = max(0.0, estimate.total_bytes / share - _HEADROOM_LINE) / (
                    1 - _HEADROOM_LINE
                )
            peaks = np.array([effective_peak_tflops(n, config.precision) for n in representative])
            compute = peaks[type_ok].max() / peaks - 1
            if not (type_ok & memory_ok).any():
                largest = max(
                    n.gpu_memory_bytes for n, ok in zip(representative, type_ok, strict=True) if ok
                )
                return (
                    f"out of memory: needs {estimate.describe()}; the largest allowed GPU has "
                    f"{largest * spec.gpu_milli / MILLI_PER_GPU / (1 << 30):.1f} GiB for the job"
                )
        allowed = type_ok & memory_ok
        job = PreparedJob(
            spec=spec,
            config=config,
            allowed=allowed,
            compute=compute,
            headroom=headroom,
            block=world,
        )
        sizes = block_sizes(job, state.max_gpus_per_node(allowed))
        if not sizes:
            return (
                f"{world} ranks with tp={config.layout.tp} cannot be split over at most "
                f"{spec.max_nodes} node(s) of the allowed models"
            )
        block = sizes[0]
        # A model none of whose nodes can host a unit (GPUs, cores, memory) is not an option:
        # leaving it in the mask would hide from the scarcity term that a 120-core pod can
        # only go to the few nodes that have 120 cores. The smallest unit asks least of a
        # node in every resource, so a model that can host some unit size can host it.
        smallest = sizes[-1]
        hostable = self.hostable(
            smallest,
            math.ceil(spec.cpu_milli * smallest / world),
            math.ceil(spec.memory_mib * smallest / world),
        )
        if not (allowed & hostable).any():
            return (
                f"no node of an allowed model can host {block} of its ranks with "
                f"{math.ceil(spec.cpu_milli * block / world) / 1000:g} cores and "
                f"{math.ceil(spec.memory_mib * block / world)} MiB"
            )
        allowed = allowed & hostable
        key = (allowed.tobytes(), compute.tobytes(), headroom.tobytes())
        terms_id = self._terms_ids.setdefault(key, len(self._terms_ids))
        return allowed, compute, headroom, block, terms_id


_PREPARERS: dict[Hashable, _Preparer] = {}
"""Preparers by the cluster's static shape: what a job's request means for a cluster
depends on its nodes' GPU models, memories and capacities only, not on what is free, so
successive plans on one cluster (a daemon's ticks, an environment's steps) share it."""
_MAX_PREPARERS = 8


def _preparer(state: FreeCapacity) -> _Preparer:
    kept = state.memo.get("preparer")
    if isinstance(kept, _Preparer):
        return kept  # the same cluster as a recent plan's (``FreeCapacity.of``)
    key = state.shape_key()
    found = _PREPARERS.pop(key, None)
    if found is None:
        found = _Preparer(state)
        if len(_PREPARERS) >= _MAX_PREPARERS:
            _PREPARERS.pop(next(iter(_PREPARERS)))
    _PREPARERS[key] = found  # most recently used last
    state.memo["preparer"] = found
    return found


def prepare_all(
    jobs: Sequence[JobSpec], configs: Mapping[str, JobConfig], state: FreeCapacity
) -> tuple[list[PreparedJob], dict[str, str]]:
    """The jobs that can be placed somewhere, in queue order (higher priority first,
    then earlier submission, then the order given), and why the others cannot."""
    ids = {j.job_id for j in jobs}
    if len(ids) != len(jobs):
        names = [j.job_id for j in jobs]
        duplicate = next(i for i in names if names.count(i) > 1)
        raise ValueError(f"jobs: job_id {duplicate!r} appears twice")
    preparer = _preparer(state)
    prepared: list[PreparedJob] = []
    unplaced: dict[str, str] = {}
    order = sorted(range(len(jobs)), key=lambda i: (-jobs[i].priority, jobs[i].submitted_at, i))
    for i in order:
        spec = jobs[i]
        job, reason = preparer.prepare(spec, preparer.config(spec, configs))
        if job is None:
            unplaced[spec.job_id] = reason
        else:
            prepared.append(job)
    return prepared, unplaced


def largest_gang(spec: JobSpec, nodes: Sequence[NodeInfo]) -> int:
    """The most whole-GPU ranks any plan could give ``spec`` on ``nodes`` with all of them
    free: a job's ranks run on one GPU model it allows, on at most ``max_nodes`` nodes.
    Memory, CPU and what is free are not counted."""
    return max(
        (
            sum(counts[: spec.max_nodes])  # all of them when max_nodes is None
            for model, counts in node_table(nodes).node_gpus_by_model.items()
            if spec.allows(model)
        ),
        default=0,
    )
