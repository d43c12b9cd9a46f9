"""The Planner: which GPUs each job's ranks run on.

Pure and synchronous, like AdaptDL's ``PolluxPolicy.optimize``: typed jobs, nodes,
chosen configs and current placements in; placements and reasons out. No I/O.

How it works
------------
1. **Feasibility.** For every job and GPU model: is the model allowed (``gpu_types``)
   and does one rank fit its share of that GPU's memory (``autotune.perf.memory``)? A job no
   model can hold comes back unplaced with the reason; it is never placed. Jobs with the
   same request share this work.
2. **Placement units.** Ranks that must share a node form a unit: the whole job when
   ``max_nodes == 1`` (a Kubernetes pod); otherwise blocks of consecutive ranks, a
   multiple of ``tp`` and at most one node's GPUs, so tensor-parallel groups never cross
   the network and pipeline neighbours fill a node before the next one is used. When no
   node can take a block, the job is retried with smaller blocks (down to ``tp``).
   **One GPU model per job.** Synchronous training runs at the pace of its slowest GPU
   (``autotune.perf.model.shape_of``), so all units of a job go to nodes of one model:
   in each round, a job of several units may use only the model, among those with a
   node able to take each of its units, where its units cost least on their cheapest
   nodes (below; the fastest adequate model unless scarcity says otherwise). With no
   such model, it is retried with smaller blocks, else unplaced.
3. **Waiting jobs.** Running jobs keep their placement first. A pending job asking for
   more GPUs than its allowed models then have free (GPUs with at least its milli free;
   for a job that may span nodes, than one of its allowed models has free) cannot be
   placed, as the cluster only fills from here on: it comes back unplaced at once with
   the count and never enters a round. When no GPU is free, no round runs.
   (Checked once, before the rounds: dropping jobs between rounds would change the
   batches, and with them the placements of the other jobs.)
4. **Decision rounds.** Pending jobs are taken in order (priority, then submission) in
   batches of ``round_size`` units. Each round builds a units x nodes cost matrix, where
   an entry is the cost of the cheapest GPU set for the unit on that node, and solves it
   with ``scipy.optimize.linear_sum_assignment``; every unit also gets a private
   "not this round" column, priced far above any real entry and in proportion to the
   unit's GPUs, so the matching allocates as many GPUs as it can, earlier jobs first on
   equal terms. A node takes at most one new unit per round, so every entry is exact
   against the round's state.
   The matrix is built once per distinct request in the batch (shape and per-model
   terms) with numpy, plus one row per unit of a running job that moves. Columns are
   pruned to each row's ``rows`` cheapest nodes, which cannot change the optimum (at
   most ``rows - 1`` of them are taken by other rows).
5. **Gang semantics.** A job whose units were not all matched releases them all and
   waits for the next round; a job that no node set can take is unplaced with a reason.
6. **Packing fallback.** A job that may span nodes, without tensor parallelism, on
   whole GPUs, that no equal blocks could place (6 ranks on nodes with 4, 1 and 1 free
   GPUs) takes the free GPUs as they are, the nodes with most free first, on one GPU
   model: unequal blocks beat waiting while the GPUs it needs are idle. Pollux's
   simulator places every job this way.

The cost of a unit on a node (lower is better), in GPU-equivalents:

- fragmentation: growth of the node's fragmentation, the GPU capacity that the pending
  workload's typical requests could no longer use (FGD, Weng et al., "Beware of
  Fragmentation", USENIX ATC 2023), including requests the node's CPU or memory can
  no longer host;
- scarcity: GPUs taken from a model in demand by jobs that can run only on few models,
  weighted by that model's pressure (pending demand spread over allowed models / free);
- compute fit: how much slower this GPU model runs the job than the fastest allowed one;
- memory headroom: a rank that would use more than 90% of the GPU's memory;
- moving: ranks of a running job that would leave the node they are on.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from autotune.core import MILLI_PER_GPU, JobConfig, JobSpec, NodeInfo, Placement, RankSlot
from autotune.perf.memory import rank_memory
from autotune.perf.model import effective_peak_tflops

__all__ = [
    "UNPLACED_COST",
    "CostWeights",
    "FreeCapacity",
    "PlanResult",
    "WorkloadClasses",
    "first_fit",
    "plan",
    "verify_placements",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# Cost of leaving a unit unmatched in a round: far above any real entry (real entries
# are a few GPU-equivalents), so the matching first maximises the units it places.
UNPLACED_COST: Final = 1.0e6
# Entries for impossible unit/node pairs: above UNPLACED_COST, never chosen over it.
_INFEASIBLE: Final = 1.0e9
# The 90% line of GPU memory: above it a rank is one allocator spike from OOM.
_HEADROOM_LINE: Final = 0.9
# Workload classes kept for the fragmentation measure: the 64 largest request shapes
# hold 82% (gpuspec33, 405 shapes) to 98% (the other Alibaba v2023 pod files, about
# 115 shapes) of the pending GPU demand.
_MAX_CLASSES: Final = 64


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


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    placements: dict[str, Placement]
    """Every placed job, kept or new."""
    unplaced: dict[str, str]
    """Job id -> why it could not be placed."""
    kept: frozenset[str]
    """Jobs whose current placement was kept as it was."""
    rounds: int
    total_cost: float
    """Sum of the matched entries of the committed units, over all rounds."""
    solve_s: float


# --------------------------------------------------------------------------------------
# Free capacity as arrays
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Fragmentation (FGD)
# --------------------------------------------------------------------------------------


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


def _class_terms(free_milli: IntArray, c: WorkloadClasses) -> tuple[IntArray, IntArray, IntArray]:
    """Per node state and class: GPUs with enough free milli for the class, the free
    milli of the others (the fragments), and the node's total free milli."""
    free = np.clip(free_milli, 0, None)
    usable = free[:, None, :] >= c.milli[None, :, None]  # (K, M, G)
    fragment = np.where(usable, 0, free[:, None, :]).sum(axis=2)
    return usable.sum(axis=2), fragment, free.sum(axis=1)


def _expected_fragment(
    usable: IntArray,
    fragment: IntArray,
    total: IntArray,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
    c: WorkloadClasses,
) -> FloatArray:
    """Expected fragment over the classes; leading axes broadcast, classes last.
    ``usable`` and ``fragment`` carry the class axis; ``total``, ``cpu``, ``mem`` and
    ``model`` do not."""
    fits = (
        (usable >= c.gpus)
        & (cpu[..., None] >= c.cpu)
        & (mem[..., None] >= c.mem)
        & c.allowed.T[model]
    )
    per_class = np.where(fits, fragment, total[..., None])
    result: FloatArray = per_class.astype(np.float64) @ c.weight
    return result


def _fragmentation(
    free_milli: IntArray, cpu: IntArray, mem: IntArray, model: IntArray, c: WorkloadClasses
) -> FloatArray:
    """Expected GPU capacity (milli) of each of K node states, (K, G) -> (K,), that a
    request drawn from the workload classes could not use.

    For a class the node can host (model allowed, enough GPUs with the free milli it
    asks per GPU, enough CPU and memory), the GPUs with less free than that are
    fragments; for a class it cannot host, all its free GPU capacity is.
    """
    return _expected_fragment(*_class_terms(free_milli, c), cpu, mem, model, c)


def _fragmentation_one_gpu(
    free_milli: IntArray,
    terms: tuple[IntArray, IntArray, IntArray],
    milli: int,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
    c: WorkloadClasses,
) -> FloatArray:
    """``_fragmentation`` of each node after ``milli`` is taken from each of its GPUs in
    turn, (K, G) -> (K, G), updating the node's class terms (``_class_terms``) for the
    one GPU that changes instead of recounting all of them."""
    usable, fragment, total = terms
    before = np.clip(free_milli, 0, None)[:, :, None]  # (K, G, 1)
    after = before - milli
    was = before >= c.milli
    now = after >= c.milli
    return _expected_fragment(
        usable[:, None, :] - was + now,
        fragment[:, None, :] - np.where(was, 0, before) + np.where(now, 0, after),
        (total - milli)[:, None],
        cpu[:, None],
        mem[:, None],
        model[:, None],
        c,
    )


# --------------------------------------------------------------------------------------
# Units and their costs
# --------------------------------------------------------------------------------------


class _Job:
    """A job being placed: its per-model terms and its current unit size."""

    __slots__ = (
        "allowed",
        "block",
        "compute",
        "config",
        "current",
        "headroom",
        "index",
        "shape",
        "spec",
        "terms",
        "unit_cpu",
        "unit_mem",
        "units",
        "world",
    )

    def __init__(
        self,
        *,
        spec: JobSpec,
        config: JobConfig,
        allowed: BoolArray,
        compute: FloatArray,
        headroom: FloatArray,
        block: int,
        terms: int = -1,
    ) -> None:
        self.spec = spec
        self.config = config
        self.allowed = allowed
        """Per GPU model: type allowed and a rank fits its memory."""
        self.compute = compute
        """Per GPU model: compute-fit cost of one GPU."""
        self.headroom = headroom
        """Per GPU model: memory-headroom cost of one GPU."""
        self.terms = terms
        """Equal for jobs with equal ``allowed``, ``compute`` and ``headroom``: with equal
        shapes, their units have equal costs everywhere."""
        self.world: int = config.world_size
        self.current: Placement | None = None
        self.index = -1
        """Position among the pending jobs."""
        self.block = self.units = self.unit_cpu = self.unit_mem = 0
        self.shape: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.set_block(block)

    def set_block(self, block: int) -> None:
        """Ranks per unit, and what follows from it."""
        spec, world = self.spec, self.world
        self.block = block
        self.units = world // block
        self.unit_cpu = math.ceil(spec.cpu_milli * block / world)
        self.unit_mem = math.ceil(spec.memory_mib * block / world)
        self.shape = (block, spec.gpu_milli, self.unit_cpu, self.unit_mem)


def _block_sizes(job: _Job, max_gpus_per_node: int) -> list[int]:
    """Unit sizes to try, largest first: multiples of tp dividing the world size."""
    world, tp = job.world, job.config.layout.tp
    if job.spec.max_nodes == 1:
        return [world]
    sizes = [
        b for b in range(min(world, max_gpus_per_node), 0, -1) if world % b == 0 and b % tp == 0
    ]
    if job.spec.max_nodes is not None:
        sizes = [b for b in sizes if world // b <= job.spec.max_nodes]
    return sizes


def _spans_nodes(job: _Job) -> bool:
    """Whether the job's ranks may go to more than one node. Synchronous training runs
    at the pace of its slowest GPU, so such a job's ranks all go to one GPU model."""
    return job.spec.max_nodes != 1 and job.world > 1


class _ShapeCosts:
    """Per node: fragmentation growth and GPU choice for one request shape, kept up to
    date lazily through the nodes' version counters."""

    def __init__(self, n_nodes: int) -> None:
        self.delta: FloatArray = np.full(n_nodes, np.inf)
        self.option: IntArray = np.full(n_nodes, -1, dtype=np.int64)
        self.version: IntArray = np.full(n_nodes, -1, dtype=np.int64)


class _CostModel:
    def __init__(self, state: FreeCapacity, classes: WorkloadClasses, weights: CostWeights) -> None:
        self.state = state
        self.classes = classes
        self.weights = weights
        self.shapes: dict[tuple[int, int, int, int], _ShapeCosts] = {}
        self.gpu_nodes: IntArray = np.nonzero(state.gpu_nodes)[0]
        n, k = len(state.nodes), len(classes.weight)
        # The class terms of every node's current state, shared by all shapes and kept
        # up to date through the nodes' version counters.
        self._node_version: IntArray = np.full(n, -1, dtype=np.int64)
        self._usable: IntArray = np.zeros((n, k), dtype=np.int64)
        self._fragment: IntArray = np.zeros((n, k), dtype=np.int64)
        self._total: IntArray = np.zeros(n, dtype=np.int64)
        self._closed: dict[int, BoolArray] = {}
        self._last_before: tuple[tuple[bytes, bytes], FloatArray] | None = None

    def shape_costs(self, shape: tuple[int, int, int, int]) -> _ShapeCosts:
        entry = self.shapes.get(shape)
        if entry is None:
            entry = self.shapes[shape] = _ShapeCosts(len(self.state.nodes))
        nodes = self.gpu_nodes
        stale = nodes[entry.version[nodes] != self.state.version[nodes]]
        if len(stale):
            self._refresh(shape, entry, stale)
        return entry

    def _node_terms(self, nodes: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """``_class_terms`` of the nodes as they are now."""
        s = self.state
        stale = nodes[self._node_version[nodes] != s.version[nodes]]
        if len(stale):
            usable, fragment, total = _class_terms(s.free_milli[stale], self.classes)
            self._usable[stale] = usable
            self._fragment[stale] = fragment
            self._total[stale] = total
            self._node_version[stale] = s.version[stale]
        return self._usable[nodes], self._fragment[nodes], self._total[nodes]

    def _before(
        self, nodes: IntArray, terms: tuple[IntArray, IntArray, IntArray], model: IntArray
    ) -> FloatArray:
        """``_fragmentation`` of the nodes as they are now. The shapes of a round are
        refreshed one after the other, mostly on the same nodes: the last answer is kept
        for the same nodes at the same versions."""
        s = self.state
        key = (nodes.tobytes(), s.version[nodes].tobytes())
        if self._last_before is not None and self._last_before[0] == key:
            return self._last_before[1]
        before = _expected_fragment(
            *terms, s.free_cpu[nodes], s.free_mem[nodes], model, self.classes
        )
        self._last_before = (key, before)
        return before

    def _refresh(
        self, shape: tuple[int, int, int, int], entry: _ShapeCosts, nodes: IntArray
    ) -> None:
        gpus, milli, cpu, mem = shape
        s = self.state
        free = s.free_milli[nodes]
        cpu_left = s.free_cpu[nodes] - cpu
        mem_left = s.free_mem[nodes] - mem
        model = s.model_of[nodes]
        terms = self._node_terms(nodes)
        before = self._before(nodes, terms, model)
        host_ok = (cpu_left >= 0) & (mem_left >= 0)
        n, _width = free.shape
        if gpus == 1:
            # Try every GPU as the one the rank goes to; keep the best per node.
            after = _fragmentation_one_gpu(
                free, terms, milli, cpu_left, mem_left, model, self.classes
            )
            fits = free >= milli
            score = np.where(fits, after - before[:, None], np.inf)
            # Among the GPUs that grow fragmentation least, the one left with the least
            # free capacity (best fit), then the lowest index.
            tied = fits & (score <= score.min(axis=1, keepdims=True) + 1e-9)
            option = np.argmin(np.where(tied, free - milli, MILLI_PER_GPU + 1), axis=1)
            delta = score[np.arange(n), option]
        else:
            # Whole GPUs: any set of free GPUs gives the same node state up to order. A
            # whole free GPU is usable by every class and no fragment; once taken, it is
            # neither: the class terms follow without recounting.
            usable, fragment, total = terms
            enough = (free >= MILLI_PER_GPU).sum(axis=1) >= gpus
            after = _expected_fragment(
                usable - gpus,
                fragment,
                total - gpus * MILLI_PER_GPU,
                cpu_left,
                mem_left,
                model,
                self.classes,
            )
            delta = np.where(enough, after - before, np.inf)
            option = np.full(n, -1, dtype=np.int64)
        entry.delta[nodes] = np.where(host_ok, delta, np.inf)
        entry.option[nodes] = option
        entry.version[nodes] = s.version[nodes]

    def closed(self, job: _Job) -> BoolArray:
        """Nodes the job's units can never use: no GPUs, or a model it may not use."""
        found = self._closed.get(job.terms) if job.terms >= 0 else None
        if found is None:
            s = self.state
            found = ~(s.gpu_nodes & job.allowed[s.model_safe])
            if job.terms >= 0:
                self._closed[job.terms] = found
        return found

    def base_row(self, job: _Job, pressure: FloatArray) -> FloatArray:
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
        cost: FloatArray = w.fragmentation * entry.delta / MILLI_PER_GPU + per_model[s.model_safe]
        cost[self.closed(job)] = np.inf
        return cost

    def moving(self, job: _Job) -> FloatArray:
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


def _workload_classes(jobs: Sequence[_Job], n_models: int) -> WorkloadClasses:
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


def _pressure(jobs: Sequence[_Job], state: FreeCapacity) -> FloatArray:
    """Per GPU model: pending GPU demand that can go there / its free GPUs. Each job's
    demand is spread over its allowed models in proportion to their free capacity."""
    if not jobs:
        return np.zeros(len(state.models))
    allowed = np.array([j.allowed for j in jobs], dtype=bool)
    demand = np.array([j.world * j.spec.gpu_milli / MILLI_PER_GPU for j in jobs])
    return _pressure_of(allowed, demand, state)


def _pressure_of(allowed: BoolArray, demand: FloatArray, state: FreeCapacity) -> FloatArray:
    free = state.free_gpus_by_model()
    if not len(allowed) or not len(free):
        return np.zeros(len(free))
    share = allowed * free[None, :]
    totals = share.sum(axis=1, keepdims=True)
    share = np.divide(share, totals, out=np.zeros_like(share), where=totals > 0)
    result: FloatArray = (share * demand[:, None]).sum(axis=0) / np.maximum(free, 1e-9)
    return result


class _Pending:
    """The pending jobs as arrays, in queue order: which are still waiting for a round,
    their demand per model (for the pressure) and their GPU count (for the check that
    they can fit at all)."""

    def __init__(self, jobs: Sequence[_Job], state: FreeCapacity) -> None:
        self.jobs = list(jobs)
        for i, job in enumerate(self.jobs):
            job.index = i
        n, n_models = len(self.jobs), len(state.models)
        self.allowed: BoolArray = np.array([j.allowed for j in self.jobs], dtype=bool).reshape(
            n, n_models
        )
        self.world: IntArray = np.fromiter((j.world for j in self.jobs), dtype=np.int64, count=n)
        milli = np.fromiter((j.spec.gpu_milli for j in self.jobs), dtype=np.int64, count=n)
        self.demand: FloatArray = self.world * milli / MILLI_PER_GPU
        self.milli_values, self.milli_index = np.unique(milli, return_inverse=True)
        self.spans: BoolArray = np.fromiter(
            (_spans_nodes(j) for j in self.jobs), dtype=bool, count=n
        )
        """Jobs whose ranks may go to several nodes: all on one GPU model."""
        self.alive: BoolArray = np.ones(n, dtype=bool)
        self.state = state

    def pressure(self) -> FloatArray:
        """``_pressure`` of the jobs still alive, in queue order."""
        alive = self.alive
        if alive.all():
            return _pressure_of(self.allowed, self.demand, self.state)
        return _pressure_of(self.allowed[alive], self.demand[alive], self.state)

    def settle(self, job: _Job) -> None:
        self.alive[job.index] = False

    def cannot_fit(self) -> list[tuple[_Job, int]]:
        """The alive jobs asking for more GPUs than their allowed models have with their
        milli free (a job that may span nodes: than one of its allowed models has), each
        with that count; they are no longer alive."""
        alive = np.nonzero(self.alive)[0]
        if not len(alive):
            return []
        state = self.state
        usable = np.stack([state.usable_gpus_by_model(int(m)) for m in self.milli_values])
        per_model = usable[self.milli_index[alive]] * self.allowed[alive]
        have = np.where(self.spans[alive], per_model.max(axis=1, initial=0), per_model.sum(axis=1))
        short = have < self.world[alive]
        if not short.any():
            return []
        out = [(self.jobs[i], int(h)) for i, h in zip(alive[short], have[short], strict=True)]
        self.alive[alive[short]] = False
        return out


def _waiting_reason(job: _Job, have: int, state: FreeCapacity) -> str:
    if _spans_nodes(job) and int(job.allowed.sum()) > 1:
        milli = job.spec.gpu_milli
        usable = state.usable_gpus_by_model(milli)
        ok = "free" if milli >= MILLI_PER_GPU else "have it"
        counts = ", ".join(
            f"{m}: {int(usable[i])} {ok}" for i, m in enumerate(state.models) if job.allowed[i]
        )
        asked = f"{job.world} GPU(s)" + (f" with {milli} milli free" if ok == "have it" else "")
        return f"no capacity: waiting for {asked} of one model ({counts})"
    models = ", ".join(m for m, ok in zip(state.models, job.allowed, strict=True) if ok)
    if job.spec.gpu_milli >= MILLI_PER_GPU:
        return f"no capacity: waiting for {job.world} GPU(s) of {models}; {have} free"
    return (
        f"no capacity: waiting for {job.world} GPU(s) with {job.spec.gpu_milli} milli free "
        f"of {models}; {have} have it"
    )


# --------------------------------------------------------------------------------------
# Preparing jobs
# --------------------------------------------------------------------------------------

_Prepared = tuple[BoolArray, FloatArray, FloatArray, int, int]
"""allowed, compute, headroom, first block size, terms id."""


class _Preparer:
    """``_prepare`` with the work shared between jobs of equal requests: jobs that
    differ only in id, priority and submission time get the same answer."""

    def __init__(self, state: FreeCapacity) -> None:
        self.state = state
        self._results: dict[Hashable, _Prepared | str] = {}
        self._type_ok: dict[tuple[str, ...] | None, BoolArray] = {}
        self._hostable: dict[tuple[int, int, int], BoolArray] = {}
        self._terms: dict[tuple[bytes, bytes, bytes], int] = {}
        self._data_parallel: dict[int, JobConfig] = {}

    def config(self, spec: JobSpec, configs: Mapping[str, JobConfig]) -> JobConfig:
        config = configs.get(spec.job_id)
        if config:
            return config
        found = self._data_parallel.get(spec.min_gpus)
        if found is None:
            found = self._data_parallel[spec.min_gpus] = JobConfig.data_parallel(spec.min_gpus)
        return found

    def job(self, spec: JobSpec, config: JobConfig) -> tuple[_Job | None, str]:
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
            found = self._prepare(spec, config)
            if key is not None:
                if len(self._results) > 100_000:
                    self._results.clear()
                self._results[key] = found
        if isinstance(found, str):
            return None, found
        allowed, compute, headroom, block, terms = found
        job = _Job(
            spec=spec,
            config=config,
            allowed=allowed,
            compute=compute,
            headroom=headroom,
            block=block,
            terms=terms,
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

    def _prepare(self, spec: JobSpec, config: JobConfig) -> _Prepared | str:
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
        job = _Job(
            spec=spec,
            config=config,
            allowed=allowed,
            compute=compute,
            headroom=headroom,
            block=world,
        )
        sizes = _block_sizes(job, state.max_gpus_per_node(allowed))
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
        terms = self._terms.setdefault(key, len(self._terms))
        return allowed, compute, headroom, block, terms


def _reserve(state: FreeCapacity, spec: JobSpec, placement: Placement) -> None:
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


_PREPARERS: dict[Hashable, _Preparer] = {}
"""Preparers by the cluster's static shape: what a job's request means for a cluster
depends on its nodes' GPU models, memories and capacities only, not on what is free, so
successive plans on one cluster (a daemon's ticks, an environment's steps) share it."""
_MAX_PREPARERS = 8


def _preparer(state: FreeCapacity) -> _Preparer:
    key = tuple(
        (
            n.node_id,
            n.gpu_model,
            n.gpu_count,
            n.gpu_memory_bytes,
            n.cpu_milli,
            n.memory_mib,
            tuple(sorted(n.peak_tflops.items())),
        )
        for n in state.nodes
    )
    found = _PREPARERS.pop(key, None)
    if found is None:
        found = _Preparer(state)
        if len(_PREPARERS) >= _MAX_PREPARERS:
            _PREPARERS.pop(next(iter(_PREPARERS)))
    _PREPARERS[key] = found  # most recently used last
    return found


def _prepare_all(
    jobs: Sequence[JobSpec], configs: Mapping[str, JobConfig], state: FreeCapacity
) -> tuple[list[_Job], dict[str, str]]:
    """The jobs that can be placed somewhere, in queue order (higher priority first,
    then earlier submission, then the order given), and why the others cannot."""
    ids = {j.job_id for j in jobs}
    if len(ids) != len(jobs):
        names = [j.job_id for j in jobs]
        duplicate = next(i for i in names if names.count(i) > 1)
        raise ValueError(f"jobs: job_id {duplicate!r} appears twice")
    preparer = _preparer(state)
    prepared: list[_Job] = []
    unplaced: dict[str, str] = {}
    order = sorted(range(len(jobs)), key=lambda i: (-jobs[i].priority, jobs[i].submitted_at, i))
    for i in order:
        spec = jobs[i]
        job, reason = preparer.job(spec, preparer.config(spec, configs))
        if job is None:
            unplaced[spec.job_id] = reason
        else:
            prepared.append(job)
    return prepared, unplaced


def _unplaced_reason(job: _Job, state: FreeCapacity) -> str:
    """Which resource kept the job out, against the state it was given up in."""
    gpus, milli, cpu, mem = job.shape
    eligible = state.gpu_nodes & job.allowed[state.model_safe]
    unit = f"{gpus} GPU(s) at {milli} milli" if milli < MILLI_PER_GPU else f"{gpus} free GPU(s)"
    what = f"{job.units} node(s) with {unit}" if job.units > 1 else f"a node with {unit}"
    gpu_ok = eligible & ((state.free_milli >= milli).sum(axis=1) >= gpus)
    if job.units > 1 and int(job.allowed.sum()) > 1:
        # The units all go to one GPU model: count the nodes of each.
        def by_model(ok: BoolArray) -> tuple[bool, str]:
            counts = np.bincount(state.model_safe[ok], minlength=len(state.models))
            text = ", ".join(
                f"{m}: {int(counts[i])}" for i, m in enumerate(state.models) if job.allowed[i]
            )
            return int(counts.max(initial=0)) < job.units, text

        short, counts = by_model(gpu_ok)
        if short:
            return f"no capacity: needs {what} of one allowed model; {counts} have it"
        cpu_ok = gpu_ok & (state.free_cpu >= cpu)
        short, counts = by_model(cpu_ok)
        if short:
            return (
                f"no capacity: needs {what} of one allowed model and {cpu / 1000:g} free "
                f"cores; {counts} have both"
            )
        short, counts = by_model(cpu_ok & (state.free_mem >= mem))
        if short:
            return (
                f"no capacity: needs {what} of one allowed model, {cpu / 1000:g} cores and "
                f"{mem} MiB; {counts} have all three"
            )
        return "no capacity: competing jobs took the nodes it could use"
    if gpu_ok.sum() < job.units:
        return f"no capacity: needs {what} of an allowed model; {int(gpu_ok.sum())} have it"
    cpu_ok = gpu_ok & (state.free_cpu >= cpu)
    if cpu_ok.sum() < job.units:
        return (
            f"no capacity: needs {what} and {cpu / 1000:g} free cores; "
            f"{int(gpu_ok.sum())} have the GPUs, {int(cpu_ok.sum())} also the cores"
        )
    mem_ok = cpu_ok & (state.free_mem >= mem)
    if mem_ok.sum() < job.units:
        return (
            f"no capacity: needs {what}, {cpu / 1000:g} cores and {mem} MiB; "
            f"{int(mem_ok.sum())} nodes have all three"
        )
    return "no capacity: competing jobs took the nodes it could use"


# --------------------------------------------------------------------------------------
# The rounds
# --------------------------------------------------------------------------------------


def _commit(
    matched: Sequence[tuple[_Job, Sequence[int]]], cost_model: _CostModel
) -> list[Placement]:
    """Take the GPUs of the jobs matched whole in a round, each job's units on the given
    nodes. Nodes are untouched since the round's costs were computed and each takes at
    most one unit (a node takes one unit per round), so the cached GPU choice still
    holds and all units are taken at once."""
    state = cost_model.state
    jobs = [job for job, _ in matched]
    unit_node = [node for _, nodes in matched for node in nodes]
    counts = [len(nodes) for _, nodes in matched]
    node = np.array(unit_node, dtype=np.int64)
    block = np.repeat(np.array([job.block for job in jobs], dtype=np.int64), counts)
    milli = np.repeat(np.array([job.spec.gpu_milli for job in jobs], dtype=np.int64), counts)
    cpu = np.repeat(np.array([job.unit_cpu for job in jobs], dtype=np.int64), counts)
    mem = np.repeat(np.array([job.unit_mem for job in jobs], dtype=np.int64), counts)
    if len(np.unique(node)) != len(node):
        raise ValueError("a node was matched to two units of one round")
    if (state.free_cpu[node] < cpu).any() or (state.free_mem[node] < mem).any():
        raise ValueError("a matched node lacks CPU or memory")
    free = state.free_milli[node]  # (units, width), a copy
    # Single-GPU units: the GPU the shape's costs chose on that node.
    single = np.flatnonzero(block == 1)
    gpu = np.full(len(node), -1, dtype=np.int64)
    if len(single):
        first_unit = np.cumsum([0, *counts])
        by_shape: dict[tuple[int, int, int, int], list[int]] = {}
        for i, job in enumerate(jobs):
            if job.block == 1:
                by_shape.setdefault(job.shape, []).extend(range(first_unit[i], first_unit[i + 1]))
        for shape, units in by_shape.items():
            gpu[units] = cost_model.shapes[shape].option[node[units]]
        rows = np.arange(len(node))[single]
        if (gpu[single] < 0).any() or (free[rows, gpu[single]] < milli[single]).any():
            raise ValueError("a matched GPU lacks the milli asked")
        free[rows, gpu[single]] -= milli[single]
    # Multi-GPU units: the first whole free GPUs of the node.
    multi = np.flatnonzero(block > 1)
    multi_gpus: list[int] = []
    if len(multi):
        whole = free[multi] >= MILLI_PER_GPU
        chosen = whole & (np.cumsum(whole, axis=1) <= block[multi, None])
        if (chosen.sum(axis=1) != block[multi]).any():
            raise ValueError("a matched node lacks the whole GPUs asked")
        free[multi] -= chosen * MILLI_PER_GPU
        multi_gpus = np.nonzero(chosen)[1].tolist()
    state.free_milli[node] = free
    state.free_cpu[node] -= cpu
    state.free_mem[node] -= mem
    state.version[node] += 1
    # The placements, rank by rank.
    node_ids = [state.nodes[n].node_id for n in unit_node]
    gpu_list = gpu.tolist()
    placements: list[Placement] = []
    unit = 0
    taken = 0
    for job, count in zip(jobs, counts, strict=True):
        job_milli = job.spec.gpu_milli
        slots: list[RankSlot] = []
        if job.block == 1:
            for u in range(count):
                slots.append(
                    RankSlot(
                        rank=u,
                        node_id=node_ids[unit + u],
                        gpu_index=gpu_list[unit + u],
                        gpu_milli=job_milli,
                    )
                )
        else:
            rank = 0
            for u in range(count):
                node_id = node_ids[unit + u]
                for g in multi_gpus[taken : taken + job.block]:
                    slots.append(
                        RankSlot(rank=rank, node_id=node_id, gpu_index=g, gpu_milli=job_milli)
                    )
                    rank += 1
                taken += job.block
        unit += count
        placements.append(Placement(job_id=job.spec.job_id, ranks=tuple(slots)))
    return placements


@dataclass(frozen=True, slots=True)
class _RoundOutcome:
    nodes: dict[int, list[int]]
    """Batch position -> node of each unit, for the jobs matched whole."""
    cost: float
    """Sum of those jobs' matched entries."""
    hopeless: set[int]
    """Batch positions of jobs with a unit that no node can take."""


def _unmatched_costs(batch: Sequence[_Job]) -> FloatArray:
    """Cost of leaving one of each job's units out of the round: ``UNPLACED_COST`` per
    GPU of the unit, up to 1.5x for the first job of the batch. The matching so
    allocates as many GPUs as it can, and on equal terms serves earlier jobs first.
    (Per unit rather than per GPU, it would favour small jobs and starve large ones: on
    the Alibaba ``default`` pods it allocates 5,944 GPUs this way and ~15 fewer per
    unit.)"""
    n = len(batch)
    return np.array(
        [
            UNPLACED_COST * job.block * job.spec.gpu_milli / MILLI_PER_GPU * (1 + 0.5 * (n - p) / n)
            for p, job in enumerate(batch)
        ]
    )


@dataclass(frozen=True, slots=True)
class _RoundCosts:
    rows: FloatArray
    """(distinct rows, nodes): the distinct cost rows of the round's units."""
    row_of: IntArray
    """Per unit (the batch's units in order): its row in ``rows``."""
    owner: IntArray
    """Per unit: the batch position of its job."""
    job_row: list[int]
    """Per batch position: the row of its base costs (without the moving term)."""


def _round_costs(
    batch: Sequence[_Job], cost_model: _CostModel, pressure: FloatArray
) -> _RoundCosts:
    """The cost of every unit of the batch on every node, built once per distinct
    request (shape and per-model terms) and once per unit of a running job."""
    rows: list[FloatArray] = []
    row_of: list[int] = []
    owner: list[int] = []
    job_row: list[int] = []
    distinct: dict[tuple[tuple[int, int, int, int], int], int] = {}
    for position, job in enumerate(batch):
        key = (job.shape, job.terms)
        base = distinct.get(key) if job.terms >= 0 else None
        if base is None:
            base = len(rows)
            rows.append(cost_model.base_row(job, pressure))
            if job.terms >= 0:
                distinct[key] = base
        job_row.append(base)
        owner.extend([position] * job.units)
        if job.current is None:
            row_of.extend([base] * job.units)
        else:
            moving = cost_model.moving(job)
            for unit in range(job.units):
                row_of.append(len(rows))
                rows.append(rows[base] + moving[unit])
    return _RoundCosts(
        rows=np.array(rows).reshape(len(rows), len(cost_model.state.nodes)),
        row_of=np.array(row_of, dtype=np.int64),
        owner=np.array(owner, dtype=np.int64),
        job_row=job_row,
    )


def _one_model(
    batch: Sequence[_Job], costs: _RoundCosts, state: FreeCapacity
) -> tuple[FloatArray, IntArray, set[int]]:
    """The round's rows with each job of several units held to one GPU model, the rows
    of its units, and the batch positions of the hopeless jobs (no node, or for a job of
    several units no model with a node for each unit, can take it: the cluster only
    fills from here on).

    A job's units go to one model: synchronous training runs at the pace of its slowest
    GPU, which the per-unit costs cannot see. Of the models with enough nodes able to
    take a unit, the job gets the one where its units cost least on their cheapest
    nodes (compute fit, scarcity and memory headroom for each GPU, plus fragmentation):
    the fastest adequate model unless scarcity says otherwise. Jobs of one unit are left
    as they are: one node has one model."""
    rows, row_of, job_row = costs.rows, costs.row_of, costs.job_row
    finite: BoolArray = np.isfinite(rows)
    open_rows: list[bool] = np.any(finite, axis=1).tolist()
    hopeless = {p for p, r in enumerate(job_row) if not open_rows[r]}
    several = [p for p, job in enumerate(batch) if job.units > 1 and p not in hopeless]
    if not several:
        return rows, row_of, hopeless
    n_models = len(state.models)
    model = state.model_safe
    onehot = np.zeros((len(state.nodes), n_models))
    onehot[np.flatnonzero(state.gpu_nodes), model[state.gpu_nodes]] = 1.0
    bases = sorted({job_row[p] for p in several})
    where = {base: i for i, base in enumerate(bases)}
    nodes_per_model = finite[bases].astype(np.float64) @ onehot  # (bases, models)
    start = np.cumsum([0, *(job.units for job in batch)]).tolist()
    rows = rows.copy()
    row_of = row_of.copy()
    extra: list[FloatArray] = []
    held: dict[tuple[int, int], int] = {}
    scores: dict[tuple[int, int], FloatArray] = {}
    closed: int | None = None
    changed = False
    for p in several:
        job, base = batch[p], job_row[p]
        counts = nodes_per_model[where[base]]
        room = counts >= job.units
        units = slice(start[p], start[p + 1])
        if not room.any():
            hopeless.add(p)
            changed = True
            if job.current is None:
                if closed is None:
                    closed = len(rows) + len(extra)
                    extra.append(np.full(rows.shape[1], np.inf))
                row_of[units] = closed
            else:
                rows[row_of[units]] = np.inf
            continue
        if int((counts > 0).sum()) < 2:
            continue  # its units can only go to one model anyway
        changed = True
        candidates = np.flatnonzero(room)
        if job.current is None:
            key = (base, job.units)
            score = scores.get(key)
            if score is None:
                score = scores[key] = np.array(
                    [
                        np.partition(rows[base][finite[base] & (model == m)], job.units - 1)[
                            : job.units
                        ].sum()
                        for m in candidates
                    ]
                )
            chosen = int(candidates[int(np.argmin(score))])
            restricted = held.get((base, chosen))
            if restricted is None:
                restricted = held[(base, chosen)] = len(rows) + len(extra)
                extra.append(np.where(model == chosen, rows[base], np.inf))
            row_of[units] = restricted
        else:
            # A running job that moves: its units' rows differ by the moving term.
            own = row_of[units]
            totals: list[float] = []
            for m in candidates:
                sub = rows[own][:, finite[base] & (model == m)]
                r, c = linear_sum_assignment(sub)
                totals.append(float(sub[r, c].sum()))
            chosen = int(candidates[int(np.argmin(totals))])
            rows[np.ix_(own, np.flatnonzero(model != chosen))] = np.inf
    if not changed:
        return costs.rows, costs.row_of, hopeless
    if extra:
        rows = np.vstack([rows, np.array(extra)])
    # Only the rows still in use: the pruning of columns keeps each row's cheapest nodes.
    used, row_of = np.unique(row_of, return_inverse=True)
    return rows[used], row_of.astype(np.int64), hopeless


def _solve_round(
    batch: Sequence[_Job], cost_model: _CostModel, pressure: FloatArray
) -> _RoundOutcome:
    """Match the batch's units to nodes with one linear assignment."""
    costs = _round_costs(batch, cost_model, pressure)
    rows, row_of, hopeless = _one_model(batch, costs, cost_model.state)
    owner = costs.owner
    finite: BoolArray = np.isfinite(rows)
    n_rows = len(row_of)
    # Keep each row's n_rows cheapest nodes: the optimum never needs another column.
    # Equal rows keep equal nodes, so each distinct row is partitioned once.
    keep = min(n_rows, rows.shape[1])
    if keep < rows.shape[1]:
        best = np.argpartition(rows, keep - 1, axis=1)[:, :keep]
        columns = np.unique(best[np.take_along_axis(finite, best, axis=1)])
    else:
        columns = np.flatnonzero(finite.any(axis=0))
    sub = rows[:, columns]
    sub = np.where(np.isfinite(sub), sub, _INFEASIBLE)
    n_cols = len(columns)
    matrix = np.empty((n_rows, n_cols + n_rows))
    matrix[:, :n_cols] = sub[row_of]
    matrix[:, n_cols:] = _unmatched_costs(batch)[owner][:, None]
    row_ind, col_ind = linear_sum_assignment(matrix)
    values = matrix[row_ind, col_ind]
    matched = (col_ind < n_cols) & (values < _INFEASIBLE)
    units = np.array([job.units for job in batch], dtype=np.int64)
    whole: BoolArray = np.equal(np.bincount(owner[row_ind[matched]], minlength=len(batch)), units)
    take = matched & whole[owner[row_ind]]
    nodes: dict[int, list[int]] = {}
    for r, node in zip(row_ind[take].tolist(), columns[col_ind[take]].tolist(), strict=True):
        nodes.setdefault(int(owner[r]), []).append(node)
    return _RoundOutcome(nodes=nodes, cost=sum(values[take].tolist()), hopeless=hopeless)


def plan(
    jobs: Sequence[JobSpec],
    nodes: Sequence[NodeInfo],
    configs: Mapping[str, JobConfig],
    current: Mapping[str, Placement] | None = None,
    *,
    weights: CostWeights | None = None,
    round_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    reserved: Mapping[str, Placement] | None = None,
) -> PlanResult:
    """Place ``jobs`` on ``nodes`` under their ``configs``.

    ``reserved``: placements of jobs (among ``jobs``) that stay exactly where they are,
    without any check, before anything else is placed: running jobs the caller will not
    move even where their configuration no longer passes the memory check (a backend
    changed it). They are reported as kept.

    A job in ``current`` whose placement still matches its config and fits keeps it;
    the others are placed in decision rounds, except those asking for more GPUs than
    their allowed models have left free (a job that may span nodes: than one allowed
    model has), which are unplaced at once (``no capacity: waiting for ...``). A job's
    new ranks all run on one GPU model. Jobs without a config are placed as plain data
    parallelism over ``min_gpus`` GPUs. ``progress(settled, total)`` is called after
    every round.
    """
    started = time.perf_counter()
    if round_size < 1:
        raise ValueError(f"round_size={round_size!r}: must be >= 1")
    current = current or {}
    state = FreeCapacity(nodes)
    placements: dict[str, Placement] = {}
    kept: set[str] = set()
    pending: list[_Job] = []
    if reserved:
        by_id = {j.job_id: j for j in jobs}
        for job_id, fixed in reserved.items():
            _reserve(state, by_id[job_id], fixed)
            placements[job_id] = fixed
            kept.add(job_id)
        jobs = [j for j in jobs if j.job_id not in reserved]
    prepared, unplaced = _prepare_all(jobs, configs, state)
    # Running jobs keep what still holds before anything new is placed.
    for job in prepared:
        placement = current.get(job.spec.job_id)
        if placement is not None and _keep(job, placement, state):
            placements[job.spec.job_id] = placement
            kept.add(job.spec.job_id)
        else:
            job.current = placement
            pending.append(job)
    rounds = 0
    total_cost = 0.0
    if not pending:
        return PlanResult(
            placements=placements,
            unplaced=unplaced,
            kept=frozenset(kept),
            rounds=0,
            total_cost=0.0,
            solve_s=time.perf_counter() - started,
        )
    tracker = _Pending(pending, state)
    # The cluster only fills from here on: a job asking for more GPUs than are free
    # for it now never fits in this plan.
    for job, have in tracker.cannot_fit():
        unplaced[job.spec.job_id] = _waiting_reason(job, have, state)
    queue: deque[_Job] = deque(job for job in pending if tracker.alive[job.index])
    cost_model = (
        _CostModel(state, _workload_classes(pending, len(state.models)), weights or CostWeights())
        if queue
        else None
    )
    alone = False
    while queue:
        assert cost_model is not None
        batch = [queue.popleft()]
        units = batch[0].units
        while not alone and queue and units + queue[0].units <= round_size:
            units += queue[0].units
            batch.append(queue.popleft())
        outcome = _solve_round(batch, cost_model, tracker.pressure())
        rounds += 1
        total_cost += outcome.cost
        matched = [(batch[p], outcome.nodes[p]) for p in sorted(outcome.nodes)]
        for (job, _), placement in zip(matched, _commit(matched, cost_model), strict=True):
            placements[job.spec.job_id] = placement
            tracker.settle(job)
        reasons: dict[tuple[tuple[int, int, int, int], int, bytes], str] = {}
        retry: list[_Job] = []
        settled = False
        for position, job in enumerate(batch):
            if position in outcome.nodes:
                continue
            if position in outcome.hopeless or len(batch) == 1:
                # Nothing can take it as it is, and the cluster only fills from here on:
                # try smaller blocks, else give up on it.
                settled = True
                smaller = [
                    b
                    for b in _block_sizes(job, state.max_gpus_per_node(job.allowed))
                    if b < job.block
                ]
                if smaller:
                    job.set_block(smaller[0])
                    retry.append(job)
                elif (packed := _pack_greedy(job, state)) is not None:
                    # 6. No equal blocks fit: the free GPUs as they are, before later jobs.
                    placements[job.spec.job_id] = packed
                    tracker.settle(job)
                else:
                    # The state is the same for the whole loop: equal requests, equal reasons.
                    key = (job.shape, job.units, job.allowed.tobytes())
                    reason = reasons.get(key)
                    if reason is None:
                        reason = reasons[key] = _unplaced_reason(job, state)
                    unplaced[job.spec.job_id] = reason
                    tracker.settle(job)
            else:
                retry.append(job)  # lost its nodes to other jobs of the batch
        queue.extendleft(reversed(retry))
        # A round that neither placed nor settled anything was a gang deadlock (jobs
        # each holding part of what the others need): the next round takes one job.
        alone = not outcome.nodes and not settled
        if progress is not None:
            progress(len(placements) + len(unplaced), len(jobs))
    return PlanResult(
        placements=placements,
        unplaced=unplaced,
        kept=frozenset(kept),
        rounds=rounds,
        total_cost=total_cost,
        solve_s=time.perf_counter() - started,
    )


def _pack_greedy(job: _Job, state: FreeCapacity) -> Placement | None:
    """Whole-GPU ranks without tensor parallelism on nodes of one allowed model, the
    nodes with the most free GPUs first (ties: the first node), as many ranks on each as
    it has room for (GPUs, and each rank's share of the job's CPU and memory), within
    ``max_nodes``. ``None`` when no model has room for every rank."""
    spec, world = job.spec, job.world
    if spec.gpu_milli < MILLI_PER_GPU or not _spans_nodes(job) or job.config.layout.tp > 1:
        return None
    cpu = math.ceil(spec.cpu_milli / world)
    mem = math.ceil(spec.memory_mib / world)
    free_gpus = (state.free_milli >= MILLI_PER_GPU).sum(axis=1)
    room = free_gpus.copy()
    if cpu:
        room = np.minimum(room, state.free_cpu // cpu)
    if mem:
        room = np.minimum(room, state.free_mem // mem)
    for model in np.flatnonzero(job.allowed):
        nodes = np.flatnonzero(state.gpu_nodes & (state.model_safe == model) & (room > 0))
        order = sorted(nodes.tolist(), key=lambda n: (-int(room[n]), n))
        if spec.max_nodes is not None:
            order = order[: spec.max_nodes]
        if sum(int(room[n]) for n in order) < world:
            continue
        slots: list[RankSlot] = []
        for node in order:
            take = min(int(room[node]), world - len(slots))
            if take == 0:
                break
            gpus = [int(g) for g in np.flatnonzero(state.free_milli[node] >= MILLI_PER_GPU)[:take]]
            state.take(node, gpus, MILLI_PER_GPU, cpu * take, mem * take)
            first = len(slots)
            slots.extend(
                RankSlot(
                    rank=first + i,
                    node_id=state.nodes[node].node_id,
                    gpu_index=gpu,
                    gpu_milli=MILLI_PER_GPU,
                )
                for i, gpu in enumerate(gpus)
            )
        return Placement(job_id=spec.job_id, ranks=tuple(slots))
    return None


def _keep(job: _Job, placement: Placement, state: FreeCapacity) -> bool:
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


def verify_placements(
    jobs: Sequence[JobSpec], nodes: Sequence[NodeInfo], placements: Mapping[str, Placement]
) -> list[str]:
    """Every way ``placements`` break the cluster's limits or the jobs' constraints:
    GPU milli, CPU or memory over-committed, a disallowed GPU model, a job spread over
    more nodes than it allows, or a gang with missing ranks. Empty when valid."""
    by_id = {n.node_id: n for n in nodes}
    specs = {j.job_id: j for j in jobs}
    gpu_use: dict[tuple[str, int], int] = {}
    cpu_use: dict[str, float] = {}
    mem_use: dict[str, float] = {}
    problems: list[str] = []
    for job_id, placement in placements.items():
        spec = specs.get(job_id)
        if spec is None:
            problems.append(f"{job_id}: placed but not among the jobs")
            continue
        world = placement.world_size
        if not spec.min_gpus <= world <= spec.max_gpus:
            problems.append(f"{job_id}: {world} ranks, allowed {spec.min_gpus}-{spec.max_gpus}")
        if spec.max_nodes is not None and len(placement.nodes) > spec.max_nodes:
            problems.append(f"{job_id}: on {len(placement.nodes)} nodes, max {spec.max_nodes}")
        for slot in placement.ranks:
            node = by_id.get(slot.node_id)
            if node is None or slot.gpu_index >= node.gpu_count:
                problems.append(f"{job_id}: rank {slot.rank} on a GPU that does not exist")
                continue
            if not spec.allows(node.gpu_model):
                problems.append(f"{job_id}: rank {slot.rank} on {node.gpu_model}")
            key = (slot.node_id, slot.gpu_index)
            gpu_use[key] = gpu_use.get(key, 0) + slot.gpu_milli
            cpu_use[slot.node_id] = cpu_use.get(slot.node_id, 0) + spec.cpu_milli / world
            mem_use[slot.node_id] = mem_use.get(slot.node_id, 0) + spec.memory_mib / world
    problems += [f"GPU {k[0]}:{k[1]} holds {v} milli" for k, v in gpu_use.items() if v > 1000]
    for node_id, used in cpu_use.items():
        if used > by_id[node_id].cpu_milli + 1e-6 * max(1, len(placements)):
            problems.append(f"node {node_id}: {used:.0f} CPU milli of {by_id[node_id].cpu_milli}")
    for node_id, used in mem_use.items():
        if used > by_id[node_id].memory_mib + 1e-6 * max(1, len(placements)):
            problems.append(f"node {node_id}: {used:.0f} MiB of {by_id[node_id].memory_mib}")
    return problems


# --------------------------------------------------------------------------------------
# Baseline
# --------------------------------------------------------------------------------------


def first_fit(
    jobs: Sequence[JobSpec], nodes: Sequence[NodeInfo], configs: Mapping[str, JobConfig]
) -> PlanResult:
    """The baseline: each job in queue order on the first nodes, in the order given,
    that have room (GPUs in index order). Same units, constraints and gang rule."""
    started = time.perf_counter()
    state = FreeCapacity(nodes)
    placements: dict[str, Placement] = {}
    prepared, unplaced = _prepare_all(jobs, configs, state)
    for job in prepared:
        placement = None
        for block in _block_sizes(job, state.max_gpus_per_node(job.allowed)):
            job.set_block(block)
            placement = _first_fit_job(job, state)
            if placement is not None:
                break
        if placement is None:
            unplaced[job.spec.job_id] = _unplaced_reason(job, state)
        else:
            placements[job.spec.job_id] = placement
    return PlanResult(
        placements=placements,
        unplaced=unplaced,
        kept=frozenset(),
        rounds=0,
        total_cost=0.0,
        solve_s=time.perf_counter() - started,
    )


def _first_fit_job(job: _Job, state: FreeCapacity) -> Placement | None:
    gpus_needed, milli, cpu, mem = job.shape
    eligible = state.gpu_nodes & job.allowed[state.model_safe]
    chosen: list[tuple[int, list[int]]] = []
    used: set[int] = set()
    for _ in range(job.units):
        fits = (
            eligible
            & ((state.free_milli >= milli).sum(axis=1) >= gpus_needed)
            & (state.free_cpu >= cpu)
            & (state.free_mem >= mem)
        )
        fits[list(used)] = False
        candidates = np.nonzero(fits)[0]
        if not len(candidates):
            for node, gpus in chosen:  # gang: give back what this job took
                state.free_milli[node, gpus] += milli
                state.free_cpu[node] += cpu
                state.free_mem[node] += mem
            return None
        node = int(candidates[0])
        gpus = [int(g) for g in np.nonzero(state.free_milli[node] >= milli)[0][:gpus_needed]]
        state.take(node, gpus, milli, cpu, mem)
        chosen.append((node, gpus))
        used.add(node)
    slots = [
        RankSlot(
            rank=unit * job.block + offset,
            node_id=state.nodes[node].node_id,
            gpu_index=gpu,
            gpu_milli=milli,
        )
        for unit, (node, gpus) in enumerate(chosen)
        for offset, gpu in enumerate(gpus)
    ]
    return Placement(job_id=job.spec.job_id, ranks=tuple(slots))
