"""The baseline the Planner is measured against: first-fit in node order, with the
same units, constraints and gang rule."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from autotune.core import JobConfig, JobSpec, NodeInfo, Placement, RankSlot
from autotune.planner.capacity import FreeCapacity
from autotune.planner.feasibility import prepare_all
from autotune.planner.jobs import PreparedJob, block_sizes
from autotune.planner.reasons import unplaced_reason
from autotune.planner.rounds import PlanResult


def first_fit(
    jobs: Sequence[JobSpec], nodes: Sequence[NodeInfo], configs: Mapping[str, JobConfig]
) -> PlanResult:
    """The baseline: each job in queue order on the first nodes, in the order given,
    that have room (GPUs in index order). Same units, constraints and gang rule."""
    started = time.perf_counter()
    state = FreeCapacity.of(nodes)
    placements: dict[str, Placement] = {}
    prepared, unplaced = prepare_all(jobs, configs, state)
    for job in prepared:
        placement = None
        for block in block_sizes(job, state.max_gpus_per_node(job.allowed)):
            job.set_block(block)
            placement = _first_fit_job(job, state)
            if placement is not None:
                break
        if placement is None:
            unplaced[job.spec.job_id] = unplaced_reason(job, state)
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


def _first_fit_job(job: PreparedJob, state: FreeCapacity) -> Placement | None:
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
