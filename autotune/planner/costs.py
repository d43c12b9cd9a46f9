"""The cost model: the cost of a unit on every node, in GPU-equivalents (lower is
better), the weighted sum of the terms listed in ``autotune.planner``. The
fragmentation growth of each request shape is kept per node and brought up to date
lazily as nodes change."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autotune.core import MILLI_PER_GPU
from autotune.planner.arrays import BoolArray, FloatArray, IntArray
from autotune.planner.capacity import FreeCapacity
from autotune.planner.fragmentation import (
    WorkloadClasses,
    class_terms,
    expected_fragment,
    fragmentation_one_gpu,
)
from autotune.planner.jobs import PreparedJob


@dataclass(frozen=True, slots=True, kw_only=True)
class CostWeights:
    """Weights of the cost terms, per GPU-equivalent."""

    fragmentation: float = 1.0
    scarcity: float = 2.0
    """On ``openb_pod_list_gpuspec33`` (the trace's GPU-type constraints) the whole
    trace leaves 1,356 pods unplaced at 0, 587 at 0.5, 325 at 2 and 323 at 4
    (first-fit: 408)."""
    compute: float = 0.5
    memory_headroom: float = 1.0
    moving: float = 2.0


class ShapeCosts:
    """Per node: fragmentation growth and GPU choice for one request shape, kept up to
    date lazily through the nodes' version counters."""

    def __init__(self, n_nodes: int) -> None:
        self.growth: FloatArray = np.full(n_nodes, np.inf)
        """Fragmentation growth (milli) when a unit of the shape goes to the node; inf
        where it cannot."""
        self.best_gpu: IntArray = np.full(n_nodes, -1, dtype=np.int64)
        """For a one-GPU shape, the GPU of the node the unit takes; -1 otherwise."""
        self.version: IntArray = np.full(n_nodes, -1, dtype=np.int64)


class CostModel:
    """The costs of units on nodes during one planning call, against its
    ``FreeCapacity``: per request shape, the fragmentation growth on every node
    (``ShapeCosts``); per job, its row of costs."""

    def __init__(self, state: FreeCapacity, classes: WorkloadClasses, weights: CostWeights) -> None:
        self.state = state
        self.classes = classes
        self.weights = weights
        self.shapes: dict[tuple[int, int, int, int], ShapeCosts] = {}
        self.gpu_nodes: IntArray = np.nonzero(state.gpu_nodes)[0]
        n, k = len(state.nodes), len(classes.weight)
        # The class terms of every node's current state, shared by all shapes and kept
        # up to date through the nodes' version counters.
        self._node_version: IntArray = np.full(n, -1, dtype=np.int64)
        self._usable: IntArray = np.zeros((n, k), dtype=np.int64)
        self._fragment: IntArray = np.zeros((n, k), dtype=np.int64)
        self._total: IntArray = np.zeros(n, dtype=np.int64)
        self._closed_nodes: dict[int, BoolArray] = {}
        self._last_fragmentation_now: tuple[tuple[bytes, bytes], FloatArray] | None = None

    def shape_costs(self, shape: tuple[int, int, int, int]) -> ShapeCosts:
        entry = self.shapes.get(shape)
        if entry is None:
            entry = self.shapes[shape] = ShapeCosts(len(self.state.nodes))
        nodes = self.gpu_nodes
        stale = nodes[entry.version[nodes] != self.state.version[nodes]]
        if len(stale):
            self._refresh(shape, entry, stale)
        return entry

    def _node_terms(self, nodes: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """``class_terms`` of the nodes as they are now."""
        s = self.state
        stale = nodes[self._node_version[nodes] != s.version[nodes]]
        if len(stale):
            usable, fragment, total = class_terms(s.free_milli[stale], self.classes)
            self._usable[stale] = usable
            self._fragment[stale] = fragment
            self._total[stale] = total
            self._node_version[stale] = s.version[stale]
        return self._usable[nodes], self._fragment[nodes], self._total[nodes]

    def _fragmentation_now(
        self, nodes: IntArray, terms: tuple[IntArray, IntArray, IntArray], model: IntArray
    ) -> FloatArray:
        """``fragmentation`` of the nodes as they are now. The shapes of a round are
        refreshed one after the other, mostly on the same nodes: the last answer is kept
        for the same nodes at the same versions."""
        s = self.state
        key = (nodes.tobytes(), s.version[nodes].tobytes())
        last = self._last_fragmentation_now
        if last is not None and last[0] == key:
            return last[1]
        before = expected_fragment(
            *terms, s.free_cpu[nodes], s.free_mem[nodes], model, self.classes
        )
        self._last_fragmentation_now = (key, before)
        return before

    def _refresh(
        self, shape: tuple[int, int, int, int], entry: ShapeCosts, nodes: IntArray
    ) -> None:
        gpus, milli, cpu, mem = shape
        s = self.state
        free = s.free_milli[nodes]
        cpu_left = s.free_cpu[nodes] - cpu
        mem_left = s.free_mem[nodes] - mem
        model = s.model_of[nodes]
        terms = self._node_terms(nodes)
        before = self._fragmentation_now(nodes, terms, model)
        host_ok = (cpu_left >= 0) & (mem_left >= 0)
        n, _width = free.shape
        if gpus == 1:
            # Try every GPU as the one the rank goes to; keep the best per node.
            after = fragmentation_one_gpu(
                free, terms, milli, cpu_left, mem_left, model, self.classes
            )
            fits = free >= milli
            score = np.where(fits, after - before[:, None], np.inf)
            # Among the GPUs that grow fragmentation least, the one left with the least
            # free capacity (best fit), then the lowest index.
            tied = fits & (score <= score.min(axis=1, keepdims=True) + 1e-9)
            best_gpu = np.argmin(np.where(tied, free - milli, MILLI_PER_GPU + 1), axis=1)
            growth = score[np.arange(n), best_gpu]
        else:
            # Whole GPUs: any set of free GPUs gives the same node state up to order. A
            # whole free GPU is usable by every class and no fragment; once taken, it is
            # neither: the class terms follow without recounting.
            usable, fragment, total = terms
            enough = (free >= MILLI_PER_GPU).sum(axis=1) >= gpus
            after = expected_fragment(
                usable - gpus,
                fragment,
                total - gpus * MILLI_PER_GPU,
                cpu_left,
                mem_left,
                model,
                self.classes,
            )
            growth = np.where(enough, after - before, np.inf)
            best_gpu = np.full(n, -1, dtype=np.int64)
        entry.growth[nodes] = np.where(host_ok, growth, np.inf)
        entry.best_gpu[nodes] = best_gpu
        entry.version[nodes] = s.version[nodes]

    def closed_nodes(self, job: PreparedJob) -> BoolArray:
        """Nodes the job's units can never use: no GPUs, or a model it may not use."""
        found = self._closed_nodes.get(job.terms_id) if job.terms_id >= 0 else None
        if found is None:
            s = self.state
            found = ~(s.gpu_nodes & job.allowed[s.model_safe])
            if job.terms_id >= 0:
                self._closed_nodes[job.terms_id] = found
        return found

    def base_row(self, job: PreparedJob, pressure: FloatArray) -> FloatArray:
        """Cost of one of the job's units on every node (inf where it cannot go), before
        the moving term: equal for every unit of a job, and for jobs of equal shape and
        terms."""
        s, w = self.state, self.weights
        entry = self.shape_costs(job.shape)
        gpu_equiv = job.block * job.spec.gpu_milli / MILLI_PER_GPU
        per_model = (
            w.scarcity * pressure * gpu_equiv
            + w.compute * job.compute * job.block
            + w.memory_headroom * job.headroom * job.block
        )
        cost: FloatArray = w.fragmentation * entry.growth / MILLI_PER_GPU + per_model[s.model_safe]
        cost[self.closed_nodes(job)] = np.inf
        return cost

    def moving(self, job: PreparedJob) -> FloatArray:
        """(units, nodes): the moving term of each of the job's units on every node,
        from the ranks of its current placement that each node holds."""
        s = self.state
        assert job.current is not None
        stay = np.zeros((job.units, len(s.nodes)))
        for slot in job.current.ranks:
            unit = slot.rank // job.block
            node = s.index.get(slot.node_id)
            if unit < job.units and node is not None:
                stay[unit, node] += 1
        result: FloatArray = self.weights.moving * (job.block - stay)
        return result
