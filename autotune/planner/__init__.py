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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy.optimize import linear_sum_assignment

from autotune.core import MILLI_PER_GPU, JobConfig, JobSpec, NodeInfo, Placement, RankSlot
from autotune.planner.arrays import BoolArray, FloatArray, IntArray
from autotune.planner.capacity import FreeCapacity, _keep, _reserve
from autotune.planner.costs import CostWeights, _CostModel
from autotune.planner.feasibility import _prepare_all
from autotune.planner.fragmentation import WorkloadClasses, _workload_classes
from autotune.planner.jobs import _block_sizes, _Job, _spans_nodes
from autotune.planner.pending import _Pending
from autotune.planner.reasons import _unplaced_reason, _waiting_reason

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


# Cost of leaving a unit unmatched in a round: far above any real entry (real entries
# are a few GPU-equivalents), so the matching first maximises the units it places.
UNPLACED_COST: Final = 1.0e6
# Entries for impossible unit/node pairs: above UNPLACED_COST, never chosen over it.
_INFEASIBLE: Final = 1.0e9


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
