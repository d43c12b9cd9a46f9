"""The Planner: which GPUs each job's ranks run on.

Pure and synchronous, like AdaptDL's ``PolluxPolicy.optimize``: typed jobs, nodes,
chosen configs and current placements in; placements and reasons out. No I/O.

How it works
------------
1. **Feasibility.** For every job and GPU model: is the model allowed (``gpu_types``)
   and does one rank fit its share of that GPU's memory (``autotune.perf.memory``)? A job no
   model can hold comes back unplaced with the reason; it is never placed.
2. **Placement units.** Ranks that must share a node form a unit: the whole job when
   ``max_nodes == 1`` (a Kubernetes pod); otherwise blocks of consecutive ranks, a
   multiple of ``tp`` and at most one node's GPUs, so tensor-parallel groups never cross
   the network and pipeline neighbours fill a node before the next one is used. When no
   node can take a block, the job is retried with smaller blocks (down to ``tp``).
3. **Decision rounds.** Pending jobs are taken in order (priority, then submission) in
   batches of ``round_size`` units. Each round builds a units x nodes cost matrix, where
   an entry is the cost of the cheapest GPU set for the unit on that node, and solves it
   with ``scipy.optimize.linear_sum_assignment``; every unit also gets a private
   "not this round" column, priced far above any real entry and in proportion to the
   unit's GPUs, so the matching allocates as many GPUs as it can, earlier jobs first on
   equal terms. A node takes at most one new unit per round, so every entry is exact
   against the round's state.
   Columns are pruned to each row's ``rows`` cheapest nodes, which cannot change the
   optimum (at most ``rows - 1`` of them are taken by other rows).
4. **Gang semantics.** A job whose units were not all matched releases them all and
   waits for the next round; a job that no node set can take is unplaced with a reason.

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
from collections.abc import Callable, Mapping, Sequence
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
    "ClusterState",
    "CostWeights",
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
# Cluster state as arrays
# --------------------------------------------------------------------------------------


class ClusterState:
    """Free resources of the cluster as arrays, updated as units are placed."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        ids = [n.node_id for n in nodes]
        if len(set(ids)) != len(ids):
            duplicate = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"nodes: node_id {duplicate!r} appears twice")
        self.nodes = list(nodes)
        self.index = {node_id: i for i, node_id in enumerate(ids)}
        self.models = sorted({n.gpu_model for n in nodes if n.gpu_count > 0})
        model_index = {m: i for i, m in enumerate(self.models)}
        self.model_of: IntArray = np.array(
            [model_index[n.gpu_model] if n.gpu_count > 0 else -1 for n in nodes], dtype=np.int64
        )
        width = max((n.gpu_count for n in nodes), default=0)
        self.free_milli: IntArray = np.full((len(nodes), max(width, 1)), -1, dtype=np.int64)
        for i, n in enumerate(nodes):
            self.free_milli[i, : n.gpu_count] = MILLI_PER_GPU
        self.capacity_gpus: IntArray = np.array([n.gpu_count for n in nodes], dtype=np.int64)
        self.capacity_cpu: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.capacity_mem: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.free_cpu: IntArray = self.capacity_cpu.copy()
        self.free_mem: IntArray = self.capacity_mem.copy()
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)
        # Per-model figures (GPU memory, peak TFLOP/s) come from the first node of each.
        self.representative = [
            nodes[int(np.argmax(self.model_of == m))] for m in range(len(self.models))
        ]

    def take(self, node: int, gpus: Sequence[int], milli: int, cpu: int, mem: int) -> None:
        for g in gpus:
            if self.free_milli[node, g] < milli:
                raise ValueError(
                    f"GPU {g} of node {self.nodes[node].node_id} has "
                    f"{self.free_milli[node, g]} milli free, {milli} asked"
                )
        if self.free_cpu[node] < cpu or self.free_mem[node] < mem:
            raise ValueError(f"node {self.nodes[node].node_id} lacks CPU or memory")
        self.free_milli[node, list(gpus)] -= milli
        self.free_cpu[node] -= cpu
        self.free_mem[node] -= mem
        self.version[node] += 1

    def free_gpus_by_model(self) -> FloatArray:
        """Free GPU capacity (in GPUs) per model."""
        free = np.clip(self.free_milli, 0, None).sum(axis=1) / MILLI_PER_GPU
        out = np.zeros(len(self.models))
        gpu_nodes = self.model_of >= 0
        np.add.at(out, self.model_of[gpu_nodes], free[gpu_nodes])
        return out


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
    """Expected fragment over the classes; leading axes broadcast, classes last."""
    fits = (
        (usable >= c.gpus)
        & (cpu[..., None] >= c.cpu)
        & (mem[..., None] >= c.mem)
        & np.moveaxis(c.allowed[:, model], 0, -1)
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
    milli: int,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
    c: WorkloadClasses,
) -> FloatArray:
    """``_fragmentation`` of each node after ``milli`` is taken from each of its GPUs in
    turn, (K, G) -> (K, G), updating the class terms for the one GPU that changes
    instead of recounting all of them."""
    usable, fragment, total = _class_terms(free_milli, c)
    before = np.clip(free_milli, 0, None)[:, :, None]  # (K, G, 1)
    after = before - milli
    was = before >= c.milli
    now = after >= c.milli
    return _expected_fragment(
        usable[:, None, :] - was + now,
        fragment[:, None, :] - np.where(was, 0, before) + np.where(now, 0, after),
        np.broadcast_to(total[:, None] - milli, free_milli.shape),
        np.broadcast_to(cpu[:, None], free_milli.shape),
        np.broadcast_to(mem[:, None], free_milli.shape),
        np.broadcast_to(model[:, None], free_milli.shape),
        c,
    )


# --------------------------------------------------------------------------------------
# Units and their costs
# --------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class _Job:
    spec: JobSpec
    config: JobConfig
    allowed: BoolArray
    """Per GPU model: type allowed and a rank fits its memory."""
    compute: FloatArray
    """Per GPU model: compute-fit cost of one GPU."""
    headroom: FloatArray
    """Per GPU model: memory-headroom cost of one GPU."""
    block: int
    """Ranks per unit."""
    current: Placement | None = None

    @property
    def world(self) -> int:
        return self.config.world_size

    @property
    def units(self) -> int:
        return self.world // self.block

    def unit_cpu(self) -> int:
        return math.ceil(self.spec.cpu_milli * self.block / self.world)

    def unit_mem(self) -> int:
        return math.ceil(self.spec.memory_mib * self.block / self.world)

    def shape(self) -> tuple[int, int, int, int]:
        return (self.block, self.spec.gpu_milli, self.unit_cpu(), self.unit_mem())


def _block_sizes(job: _Job, max_gpus_per_node: int) -> list[int]:
    """Unit sizes to try, largest first: multiples of tp dividing the world size."""
    world, tp = job.world, job.config.layout.tp
    if job.spec.max_nodes == 1:
        return [world]
    sizes = [
        b for b in range(world, 0, -1) if world % b == 0 and b % tp == 0 and b <= max_gpus_per_node
    ]
    if job.spec.max_nodes is not None:
        sizes = [b for b in sizes if world // b <= job.spec.max_nodes]
    return sizes


class _ShapeCosts:
    """Per node: fragmentation growth and GPU choice for one request shape, kept up to
    date lazily through the nodes' version counters."""

    def __init__(self, n_nodes: int) -> None:
        self.delta: FloatArray = np.full(n_nodes, np.inf)
        self.option: IntArray = np.full(n_nodes, -1, dtype=np.int64)
        self.version: IntArray = np.full(n_nodes, -1, dtype=np.int64)


class _CostModel:
    def __init__(self, state: ClusterState, classes: WorkloadClasses, weights: CostWeights) -> None:
        self.state = state
        self.classes = classes
        self.weights = weights
        self.shapes: dict[tuple[int, int, int, int], _ShapeCosts] = {}
        self.gpu_nodes: IntArray = np.nonzero(state.model_of >= 0)[0]

    def shape_costs(self, shape: tuple[int, int, int, int]) -> _ShapeCosts:
        entry = self.shapes.get(shape)
        if entry is None:
            entry = self.shapes[shape] = _ShapeCosts(len(self.state.nodes))
        stale = self.gpu_nodes[entry.version[self.gpu_nodes] != self.state.version[self.gpu_nodes]]
        if len(stale):
            self._refresh(shape, entry, stale)
        return entry

    def _refresh(
        self, shape: tuple[int, int, int, int], entry: _ShapeCosts, nodes: IntArray
    ) -> None:
        gpus, milli, cpu, mem = shape
        s = self.state
        free = s.free_milli[nodes]
        cpu_left = s.free_cpu[nodes] - cpu
        mem_left = s.free_mem[nodes] - mem
        model = s.model_of[nodes]
        before = _fragmentation(free, s.free_cpu[nodes], s.free_mem[nodes], model, self.classes)
        host_ok = (cpu_left >= 0) & (mem_left >= 0)
        n, _width = free.shape
        if gpus == 1:
            # Try every GPU as the one the rank goes to; keep the best per node.
            after = _fragmentation_one_gpu(free, milli, cpu_left, mem_left, model, self.classes)
            fits = free >= milli
            score = np.where(fits, after - before[:, None], np.inf)
            # Among the GPUs that grow fragmentation least, the one left with the least
            # free capacity (best fit), then the lowest index.
            tied = fits & (score <= score.min(axis=1, keepdims=True) + 1e-9)
            option = np.argmin(np.where(tied, free - milli, MILLI_PER_GPU + 1), axis=1)
            delta = score[np.arange(n), option]
        else:
            # Whole GPUs: any set of free GPUs gives the same node state up to order.
            whole = free >= MILLI_PER_GPU
            enough = whole.sum(axis=1) >= gpus
            after_free = free.copy()
            order = np.cumsum(whole, axis=1)
            after_free[whole & (order <= gpus)] = 0
            after = _fragmentation(after_free, cpu_left, mem_left, model, self.classes)
            delta = np.where(enough, after - before, np.inf)
            option = np.full(n, -1, dtype=np.int64)
        entry.delta[nodes] = np.where(host_ok, delta, np.inf)
        entry.option[nodes] = option
        entry.version[nodes] = s.version[nodes]

    def row(self, job: _Job, unit_ranks: range, pressure: FloatArray) -> FloatArray:
        """Cost of one unit on every node (inf where it cannot go)."""
        s, w = self.state, self.weights
        shape = job.shape()
        entry = self.shape_costs(shape)
        gpu_equiv = job.block * job.spec.gpu_milli / MILLI_PER_GPU
        model = np.where(s.model_of >= 0, s.model_of, 0)
        per_model = (
            w.scarcity * pressure * gpu_equiv
            + w.compute * job.compute * job.block
            + w.memory_headroom * job.headroom * job.block
        )
        cost = w.fragmentation * entry.delta / MILLI_PER_GPU + per_model[model]
        cost[(s.model_of < 0) | ~job.allowed[model]] = np.inf
        if job.current is not None:
            stay = np.zeros(len(s.nodes))
            for slot in job.current.ranks:
                if slot.rank in unit_ranks and slot.node_id in s.index:
                    stay[s.index[slot.node_id]] += 1
            cost += w.moving * (len(unit_ranks) - stay)
        return cost


def _workload_classes(jobs: Sequence[_Job], n_models: int) -> WorkloadClasses:
    counts: dict[tuple[int, int, int, int, bytes], float] = {}
    masks: dict[bytes, BoolArray] = {}
    for job in jobs:
        # Host requests rounded up to 1 core and 1 GiB so near-identical pods share a class.
        gpus, milli, cpu, mem = job.shape()
        key = (gpus, milli, -(-cpu // 1000) * 1000, -(-mem // 1024) * 1024, job.allowed.tobytes())
        masks[key[4]] = job.allowed
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


def _pressure(jobs: Sequence[_Job], state: ClusterState) -> FloatArray:
    """Per GPU model: pending GPU demand that can go there / its free GPUs. Each job's
    demand is spread over its allowed models in proportion to their free capacity."""
    free = state.free_gpus_by_model()
    if not jobs or not len(free):
        return np.zeros(len(free))
    allowed = np.array([j.allowed for j in jobs], dtype=bool)
    demand = np.array([j.world * j.spec.gpu_milli / MILLI_PER_GPU for j in jobs])
    share = allowed * free[None, :]
    totals = share.sum(axis=1, keepdims=True)
    share = np.divide(share, totals, out=np.zeros_like(share), where=totals > 0)
    result: FloatArray = (share * demand[:, None]).sum(axis=0) / np.maximum(free, 1e-9)
    return result


# --------------------------------------------------------------------------------------
# Preparing jobs
# --------------------------------------------------------------------------------------


def _prepare(spec: JobSpec, config: JobConfig, state: ClusterState) -> tuple[_Job | None, str]:
    """The job's per-model feasibility and cost terms, or ``None`` and the reason.
    Per-model figures (memory, peak) come from the first node of each model."""
    world = config.world_size
    if not spec.min_gpus <= world <= spec.max_gpus:
        return None, (
            f"config asks for {world} GPUs, the job allows {spec.min_gpus}-{spec.max_gpus}"
        )
    representative = state.representative
    type_ok = np.array([spec.allows(m) for m in state.models], dtype=bool)
    if not type_ok.any():
        if spec.gpu_types is None:
            return None, "the cluster has no GPU nodes"
        return None, f"no node has an allowed GPU model ({', '.join(spec.gpu_types)})"
    compute = np.zeros(len(state.models))
    headroom = np.zeros(len(state.models))
    memory_ok = np.ones(len(state.models), dtype=bool)
    if spec.model is not None:
        estimate = rank_memory(spec.model, config, spec.global_batch)
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
            return None, (
                f"out of memory: needs {estimate.describe()}; the largest allowed GPU has "
                f"{largest * spec.gpu_milli / MILLI_PER_GPU / (1 << 30):.1f} GiB for the job"
            )
    job = _Job(
        spec=spec,
        config=config,
        allowed=type_ok & memory_ok,
        compute=compute,
        headroom=headroom,
        block=world,
    )
    sizes = _block_sizes(job, _max_gpus_per_node(job, state))
    if not sizes:
        return None, (
            f"{world} ranks with tp={config.layout.tp} cannot be split over at most "
            f"{spec.max_nodes} node(s) of the allowed models"
        )
    job.block = sizes[0]
    # A model none of whose nodes can host a unit (GPUs, cores, memory) is not an option:
    # leaving it in the mask would hide from the scarcity term that a 120-core pod can
    # only go to the few nodes that have 120 cores.
    gpu_nodes = state.model_of >= 0
    hostable = np.zeros(len(state.models), dtype=bool)
    for b in sizes:
        fits = (
            gpu_nodes
            & (state.capacity_gpus >= b)
            & (state.capacity_cpu >= math.ceil(spec.cpu_milli * b / world))
            & (state.capacity_mem >= math.ceil(spec.memory_mib * b / world))
        )
        hostable[state.model_of[fits]] = True
    if not (job.allowed & hostable).any():
        return None, (
            f"no node of an allowed model can host {job.block} of its ranks with "
            f"{math.ceil(spec.cpu_milli * job.block / world) / 1000:g} cores and "
            f"{math.ceil(spec.memory_mib * job.block / world)} MiB"
        )
    job.allowed &= hostable
    return job, ""


def _max_gpus_per_node(job: _Job, state: ClusterState) -> int:
    gpu_nodes = state.model_of >= 0
    eligible = gpu_nodes & job.allowed[np.where(gpu_nodes, state.model_of, 0)]
    return int(state.capacity_gpus[eligible].max(initial=0))


def _unplaced_reason(job: _Job, state: ClusterState) -> str:
    """Which resource kept the job out, against the state it was given up in."""
    gpus, milli, cpu, mem = job.shape()
    eligible = (state.model_of >= 0) & job.allowed[np.where(state.model_of >= 0, state.model_of, 0)]
    unit = f"{gpus} GPU(s) at {milli} milli" if milli < MILLI_PER_GPU else f"{gpus} free GPU(s)"
    what = f"{job.units} node(s) with {unit}" if job.units > 1 else f"a node with {unit}"
    gpu_ok = eligible & ((state.free_milli >= milli).sum(axis=1) >= gpus)
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


def _commit(job: _Job, nodes: Sequence[int], cost_model: _CostModel) -> Placement:
    """Take the matched GPUs. Nodes are untouched since the round's costs were computed
    (a node takes one unit per round), so the cached GPU choice still holds."""
    state = cost_model.state
    milli = job.spec.gpu_milli
    option = cost_model.shapes[job.shape()].option
    slots: list[RankSlot] = []
    for unit, node in enumerate(nodes):
        if job.block == 1:
            gpus = [int(option[node])]
        else:
            gpus = [int(g) for g in np.nonzero(state.free_milli[node] >= MILLI_PER_GPU)[0]]
            gpus = gpus[: job.block]
        state.take(node, gpus, milli, job.unit_cpu(), job.unit_mem())
        slots.extend(
            RankSlot(
                rank=unit * job.block + offset,
                node_id=state.nodes[node].node_id,
                gpu_index=gpu,
                gpu_milli=milli,
            )
            for offset, gpu in enumerate(gpus)
        )
    return Placement(job_id=job.spec.job_id, ranks=tuple(slots))


@dataclass(frozen=True, slots=True)
class _RoundOutcome:
    nodes: dict[int, list[int]]
    """Batch position -> node of each unit, for the jobs matched whole."""
    cost: float
    """Sum of those jobs' matched entries."""
    hopeless: set[int]
    """Batch positions of jobs with a unit that no node can take."""


def _unmatched_costs(batch: Sequence[_Job], owner: list[int]) -> FloatArray:
    """Cost of leaving each row's unit out of the round: ``UNPLACED_COST`` per GPU of
    the unit, up to 1.5x for the first job of the batch. The matching so allocates as
    many GPUs as it can, and on equal terms serves earlier jobs first. (Per unit rather
    than per GPU, it would favour small jobs and starve large ones: on the Alibaba
    ``default`` pods it allocates 5,944 GPUs this way and ~15 fewer per unit.)"""
    n = len(batch)
    return np.array(
        [
            UNPLACED_COST
            * batch[p].block
            * batch[p].spec.gpu_milli
            / MILLI_PER_GPU
            * (1 + 0.5 * (n - p) / n)
            for p in owner
        ]
    )


def _solve_round(
    batch: Sequence[_Job], cost_model: _CostModel, pressure: FloatArray
) -> _RoundOutcome:
    """Match the batch's units to nodes with one linear assignment."""
    rows: list[FloatArray] = []
    owner: list[int] = []
    for position, job in enumerate(batch):
        for unit in range(job.units):
            ranks = range(unit * job.block, (unit + 1) * job.block)
            rows.append(cost_model.row(job, ranks, pressure))
            owner.append(position)
    cost = np.array(rows)
    n_rows = len(rows)
    hopeless = {owner[r] for r in range(n_rows) if not np.isfinite(cost[r]).any()}
    # Keep each row's n_rows cheapest nodes: the optimum never needs another column.
    keep = min(n_rows, cost.shape[1])
    best = np.argpartition(cost, keep - 1, axis=1)[:, :keep]
    columns = np.unique(best[np.isfinite(np.take_along_axis(cost, best, axis=1))])
    matrix = np.empty((n_rows, len(columns) + n_rows))
    matrix[:, len(columns) :] = _unmatched_costs(batch, owner)[:, None]
    sub = cost[:, columns]
    matrix[:, : len(columns)] = np.where(np.isfinite(sub), sub, _INFEASIBLE)
    row_ind, col_ind = linear_sum_assignment(matrix)
    matched: dict[int, list[tuple[int, float]]] = {}
    for r, c in zip(row_ind, col_ind, strict=True):
        if c < len(columns) and matrix[r, c] < _INFEASIBLE:
            matched.setdefault(owner[r], []).append((int(columns[c]), float(matrix[r, c])))
    whole = {p: m for p, m in matched.items() if len(m) == batch[p].units}
    return _RoundOutcome(
        nodes={p: [node for node, _ in m] for p, m in whole.items()},
        cost=sum(c for m in whole.values() for _, c in m),
        hopeless=hopeless,
    )


def plan(
    jobs: Sequence[JobSpec],
    nodes: Sequence[NodeInfo],
    configs: Mapping[str, JobConfig],
    current: Mapping[str, Placement] | None = None,
    *,
    weights: CostWeights | None = None,
    round_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Place ``jobs`` on ``nodes`` under their ``configs``.

    A job in ``current`` whose placement still matches its config and fits keeps it;
    the others are placed in decision rounds. Jobs without a config are placed as plain
    data parallelism over ``min_gpus`` GPUs. ``progress(settled, total)`` is called
    after every round.
    """
    started = time.perf_counter()
    if round_size < 1:
        raise ValueError(f"round_size={round_size!r}: must be >= 1")
    current = current or {}
    state = ClusterState(nodes)
    placements: dict[str, Placement] = {}
    kept: set[str] = set()
    pending: list[_Job] = []
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

    cost_model = _CostModel(
        state, _workload_classes(pending, len(state.models)), weights or CostWeights()
    )
    queue: deque[_Job] = deque(pending)
    rounds = 0
    total_cost = 0.0
    alone = False
    while queue:
        batch = [queue.popleft()]
        units = batch[0].units
        while not alone and queue and units + queue[0].units <= round_size:
            units += queue[0].units
            batch.append(queue.popleft())
        outcome = _solve_round(batch, cost_model, _pressure([*batch, *queue], state))
        rounds += 1
        total_cost += outcome.cost
        for position in sorted(outcome.nodes):
            job = batch[position]
            placements[job.spec.job_id] = _commit(job, outcome.nodes[position], cost_model)
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
                    b for b in _block_sizes(job, _max_gpus_per_node(job, state)) if b < job.block
                ]
                if smaller:
                    job.block = smaller[0]
                    retry.append(job)
                else:
                    unplaced[job.spec.job_id] = _unplaced_reason(job, state)
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


def _prepare_all(
    jobs: Sequence[JobSpec], configs: Mapping[str, JobConfig], state: ClusterState
) -> tuple[list[_Job], dict[str, str]]:
    """The jobs that can be placed somewhere, in queue order (higher priority first,
    then earlier submission, then the order given), and why the others cannot."""
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"jobs: job_id {duplicate!r} appears twice")
    prepared: list[_Job] = []
    unplaced: dict[str, str] = {}
    for i in sorted(range(len(jobs)), key=lambda i: (-jobs[i].priority, jobs[i].submitted_at, i)):
        spec = jobs[i]
        config = configs.get(spec.job_id) or JobConfig.data_parallel(spec.min_gpus)
        job, reason = _prepare(spec, config, state)
        if job is None:
            unplaced[spec.job_id] = reason
        else:
            prepared.append(job)
    return prepared, unplaced


def _keep(job: _Job, placement: Placement, state: ClusterState) -> bool:
    """Keep a running job where it is if the placement still fits its config and the
    cluster; then its resources are taken."""
    if placement.world_size != job.world:
        return False
    per_rank_cpu = job.spec.cpu_milli / job.world
    per_rank_mem = job.spec.memory_mib / job.world
    need: dict[int, list[int]] = {}
    for slot in placement.ranks:
        node = state.index.get(slot.node_id)
        if node is None or slot.gpu_index >= state.nodes[node].gpu_count:
            return False
        if slot.gpu_milli != job.spec.gpu_milli:
            return False
        if not job.allowed[state.model_of[node]]:
            return False
        need.setdefault(node, []).append(slot.gpu_index)
    if job.spec.max_nodes is not None and len(need) > job.spec.max_nodes:
        return False
    for node, gpus in need.items():
        cpu = math.ceil(per_rank_cpu * len(gpus))
        mem = math.ceil(per_rank_mem * len(gpus))
        if (
            (state.free_milli[node, gpus] < job.spec.gpu_milli).any()
            or state.free_cpu[node] < cpu
            or state.free_mem[node] < mem
        ):
            return False
    for node, gpus in need.items():
        state.take(
            node,
            gpus,
            job.spec.gpu_milli,
            math.ceil(per_rank_cpu * len(gpus)),
            math.ceil(per_rank_mem * len(gpus)),
        )
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
    state = ClusterState(nodes)
    placements: dict[str, Placement] = {}
    prepared, unplaced = _prepare_all(jobs, configs, state)
    for job in prepared:
        placement = None
        for block in _block_sizes(job, _max_gpus_per_node(job, state)):
            job.block = block
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


def _first_fit_job(job: _Job, state: ClusterState) -> Placement | None:
    gpus_needed, milli, cpu, mem = job.shape()
    model = np.where(state.model_of >= 0, state.model_of, 0)
    eligible = (state.model_of >= 0) & job.allowed[model]
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
