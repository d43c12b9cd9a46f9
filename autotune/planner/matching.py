"""One decision round (steps 4 and 5): the units x nodes cost matrix of a batch, each
job of several units held to one GPU model, one linear assignment with a private
"not this round" column per unit, and the commit of the jobs matched whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy.optimize import linear_sum_assignment

from autotune.core import MILLI_PER_GPU, Placement, RankSlot
from autotune.planner.arrays import BoolArray, FloatArray, IntArray
from autotune.planner.capacity import FreeCapacity
from autotune.planner.costs import CostModel
from autotune.planner.jobs import PreparedJob

# Cost of leaving a unit unmatched in a round: far above any real entry (real entries
# are a few GPU-equivalents), so the matching first maximises the units it places.
UNPLACED_COST: Final = 1.0e6
# Entries for impossible unit/node pairs: above UNPLACED_COST, never chosen over it.
_INFEASIBLE: Final = 1.0e9


@dataclass(frozen=True, slots=True)
class RoundCosts:
    rows: FloatArray
    """(distinct rows, nodes): the distinct cost rows of the round's units."""
    row_of: IntArray
    """Per unit (the batch's units in order): its row in ``rows``."""
    owner: IntArray
    """Per unit: the batch position of its job."""
    job_row: list[int]
    """Per batch position: the row of its base costs (without the moving term)."""


def round_costs(
    batch: Sequence[PreparedJob], cost_model: CostModel, pressure: FloatArray
) -> RoundCosts:
    """The cost of every unit of the batch on every node, built once per distinct
    request (shape and per-model terms) and once per unit of a running job."""
    rows: list[FloatArray] = []
    row_of: list[int] = []
    owner: list[int] = []
    job_row: list[int] = []
    distinct: dict[tuple[tuple[int, int, int, int], int], int] = {}
    for position, job in enumerate(batch):
        key = (job.shape, job.terms_id)
        base = distinct.get(key) if job.terms_id >= 0 else None
        if base is None:
            base = len(rows)
            rows.append(cost_model.base_row(job, pressure))
            if job.terms_id >= 0:
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
    return RoundCosts(
        rows=np.array(rows).reshape(len(rows), len(cost_model.state.nodes)),
        row_of=np.array(row_of, dtype=np.int64),
        owner=np.array(owner, dtype=np.int64),
        job_row=job_row,
    )


def _hold_to_one_model(
    batch: Sequence[PreparedJob], costs: RoundCosts, state: FreeCapacity
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


def _unmatched_costs(batch: Sequence[PreparedJob]) -> FloatArray:
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
class RoundOutcome:
    nodes: dict[int, list[int]]
    """Batch position -> node of each unit, for the jobs matched whole."""
    cost: float
    """Sum of those jobs' matched entries."""
    hopeless: set[int]
    """Batch positions of jobs with a unit that no node can take."""


def solve_round(
    batch: Sequence[PreparedJob], cost_model: CostModel, pressure: FloatArray
) -> RoundOutcome:
    """Match the batch's units to nodes with one linear assignment."""
    costs = round_costs(batch, cost_model, pressure)
    rows, row_of, hopeless = _hold_to_one_model(batch, costs, cost_model.state)
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
    return RoundOutcome(nodes=nodes, cost=sum(values[take].tolist()), hopeless=hopeless)


def commit(
    matched: Sequence[tuple[PreparedJob, Sequence[int]]], cost_model: CostModel
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
            gpu[units] = cost_model.shapes[shape].best_gpu[node[units]]
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
