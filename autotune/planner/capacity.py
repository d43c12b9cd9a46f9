"""The free capacity of one planning call (``FreeCapacity``), and the placements of
running jobs taken from it: reserved as they are, or kept where they still fit."""

from __future__ import annotations

import copy
import math
from collections.abc import Hashable, Sequence

import numpy as np

from autotune.core import MILLI_PER_GPU, ByIdentity, JobSpec, NodeInfo, Placement
from autotune.planner.arrays import BoolArray, FloatArray, IntArray
from autotune.planner.jobs import PreparedJob


class FreeCapacity:
    """What is free on each node during one planning call: the milli of each GPU, the
    CPU and the memory, as arrays updated as units are placed, beside the nodes' GPU
    models and capacities. It lives for one ``plan()`` or ``first_fit()`` call; the
    daemon's view of the cluster is ``autotune.interfaces.ClusterSnapshot``."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        ids = [n.node_id for n in nodes]
        self.index = {node_id: i for i, node_id in enumerate(ids)}
        if len(self.index) != len(ids):
            duplicate = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"nodes: node_id {duplicate!r} appears twice")
        self.nodes = list(nodes)
        n = len(nodes)
        self.models = sorted({node.gpu_model for node in nodes if node.gpu_count > 0})
        model_index = {m: i for i, m in enumerate(self.models)}
        self.model_of: IntArray = np.fromiter(
            (model_index[node.gpu_model] if node.gpu_count > 0 else -1 for node in nodes),
            dtype=np.int64,
            count=n,
        )
        self.gpu_nodes: BoolArray = self.model_of >= 0
        """Nodes with GPUs."""
        self.model_safe: IntArray = np.where(self.gpu_nodes, self.model_of, 0)
        """``model_of`` with 0 for nodes without GPUs, for indexing per-model arrays."""
        self.capacity_gpus: IntArray = np.fromiter(
            (node.gpu_count for node in nodes), dtype=np.int64, count=n
        )
        self.capacity_cpu: IntArray = np.fromiter(
            (node.cpu_milli for node in nodes), dtype=np.int64, count=n
        )
        self.capacity_mem: IntArray = np.fromiter(
            (node.memory_mib for node in nodes), dtype=np.int64, count=n
        )
        width = max(int(self.capacity_gpus.max(initial=0)), 1)
        self.free_milli: IntArray = np.where(
            np.arange(width)[None, :] < self.capacity_gpus[:, None], MILLI_PER_GPU, -1
        ).astype(np.int64)
        self.free_cpu: IntArray = self.capacity_cpu.copy()
        self.free_mem: IntArray = self.capacity_mem.copy()
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        # Per-model figures (GPU memory, peak TFLOP/s) come from the first node of each.
        first: dict[int, int] = {}
        for i, m in enumerate(self.model_of.tolist()):
            if m >= 0 and m not in first:
                first[m] = i
        self.representative = [nodes[first[m]] for m in range(len(self.models))]
        # Plain lists for the per-rank checks of kept placements.
        self._gpu_count_list: list[int] = self.capacity_gpus.tolist()
        self._model_list: list[int] = self.model_of.tolist()
        self._max_gpus: dict[bytes, int] = {}
        self._shape: Hashable | None = None
        self.memo: dict[str, object] = {}
        """What planners derive from the nodes' static shape alone (shared by the copies
        ``of`` makes)."""

    @classmethod
    def of(cls, nodes: Sequence[NodeInfo]) -> FreeCapacity:
        """All of ``nodes`` free; for a tuple seen in one of the last few calls (an
        unchanged cluster, round after round), a copy of what was built from it with
        fresh free arrays (``autotune.core.ByIdentity``)."""
        fresh = copy.copy(_BUILT(nodes))
        fresh.free_milli = fresh.free_milli.copy()
        fresh.free_cpu = fresh.free_cpu.copy()
        fresh.free_mem = fresh.free_mem.copy()
        fresh.version = fresh.version.copy()
        return fresh

    def shape_key(self) -> Hashable:
        """What the nodes' requests depend on: their ids, GPU models, counts and
        memories, CPU, host memory and peaks (not what is free)."""
        if self._shape is None:
            self._shape = tuple(
                (
                    n.node_id,
                    n.gpu_model,
                    n.gpu_count,
                    n.gpu_memory_bytes,
                    n.cpu_milli,
                    n.memory_mib,
                    tuple(sorted(n.peak_tflops.items())),
                )
                for n in self.nodes
            )
        return self._shape

    def take(self, node: int, gpus: Sequence[int], milli: int, cpu: int, mem: int) -> None:
        row = self.free_milli[node]
        index = list(gpus)
        have = row[index]
        short = have < milli
        if short.any():
            g = index[int(np.argmax(short))]
            raise ValueError(
                f"GPU {g} of node {self.nodes[node].node_id} has {row[g]} milli free, {milli} asked"
            )
        if self.free_cpu[node] < cpu or self.free_mem[node] < mem:
            raise ValueError(f"node {self.nodes[node].node_id} lacks CPU or memory")
        row[index] = have - milli
        self.free_cpu[node] -= cpu
        self.free_mem[node] -= mem
        self.version[node] += 1

    def free_gpus_by_model(self) -> FloatArray:
        """Free GPU capacity (in GPUs) per model."""
        free = np.clip(self.free_milli, 0, None).sum(axis=1) / MILLI_PER_GPU
        out = np.zeros(len(self.models))
        np.add.at(out, self.model_of[self.gpu_nodes], free[self.gpu_nodes])
        return out

    def usable_gpus_by_model(self, milli: int) -> FloatArray:
        """Per model: GPUs with at least ``milli`` free."""
        usable = (self.free_milli >= milli).sum(axis=1)
        result: FloatArray = np.bincount(
            self.model_of[self.gpu_nodes],
            weights=usable[self.gpu_nodes],
            minlength=len(self.models),
        ).astype(np.float64)
        return result

    def max_gpus_per_node(self, allowed: BoolArray) -> int:
        """GPUs of the largest node of an allowed model."""
        key = allowed.tobytes()
        found = self._max_gpus.get(key)
        if found is None:
            eligible = self.gpu_nodes & allowed[self.model_safe]
            found = self._max_gpus[key] = int(self.capacity_gpus[eligible].max(initial=0))
        return found


def _built(nodes: Sequence[NodeInfo]) -> FreeCapacity:
    built = FreeCapacity(nodes)
    built.shape_key()  # computed once, shared by the copies
    return built


_BUILT = ByIdentity(_built)


def reserve_placement(state: FreeCapacity, spec: JobSpec, placement: Placement) -> None:
    """Take a placement's resources as they are (clipped at zero: never an error)."""
    world = placement.world_size
    for slot in placement.ranks:
        node = state.index.get(slot.node_id)
        if node is None or slot.gpu_index >= state.nodes[node].gpu_count:
            continue
        state.free_milli[node, slot.gpu_index] = max(
            0, int(state.free_milli[node, slot.gpu_index]) - slot.gpu_milli
        )
        state.free_cpu[node] = max(0, int(state.free_cpu[node]) - spec.cpu_milli // world)
        state.free_mem[node] = max(0, int(state.free_mem[node]) - spec.memory_mib // world)
        state.version[node] += 1


def keep_placement(job: PreparedJob, placement: Placement, state: FreeCapacity) -> bool:
    """Keep a running job where it is if the placement still fits its config and the
    cluster; then its resources are taken."""
    if len(placement.ranks) != job.world:
        return False
    milli = job.spec.gpu_milli
    index, gpu_count, model_of = state.index, state._gpu_count_list, state._model_list
    allowed = job.allowed
    need: dict[int, list[int]] = {}
    for slot in placement.ranks:
        node = index.get(slot.node_id)
        if (
            node is None
            or slot.gpu_index >= gpu_count[node]
            or slot.gpu_milli != milli
            or not allowed[model_of[node]]
        ):
            return False
        gpus = need.get(node)
        if gpus is None:
            need[node] = [slot.gpu_index]
        else:
            gpus.append(slot.gpu_index)
    if job.spec.max_nodes is not None and len(need) > job.spec.max_nodes:
        return False
    per_rank_cpu = job.spec.cpu_milli / job.world
    per_rank_mem = job.spec.memory_mib / job.world
    asks = [
        (node, gpus, math.ceil(per_rank_cpu * len(gpus)), math.ceil(per_rank_mem * len(gpus)))
        for node, gpus in need.items()
    ]
    # Few GPUs per node: element by element is faster here than fancy indexing.
    free_milli, free_cpu, free_mem = state.free_milli, state.free_cpu, state.free_mem
    for node, gpus, cpu, mem in asks:
        if free_cpu[node] < cpu or free_mem[node] < mem:
            return False
        row = free_milli[node]
        if any(row[g] < milli for g in gpus):
            return False
    for node, gpus, cpu, mem in asks:
        row = free_milli[node]
        for g in gpus:
            row[g] -= milli
        free_cpu[node] -= cpu
        free_mem[node] -= mem
        state.version[node] += 1
    return True
