"""``plan()``: reserved and kept placements first, then the pending jobs in decision
rounds until each is placed or unplaced with its reason (steps 3-6)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune.core import JobConfig, JobSpec, NodeInfo, Placement
from autotune.planner.capacity import FreeCapacity, keep_placement, reserve_placement
from autotune.planner.costs import CostModel, CostWeights
from autotune.planner.feasibility import prepare_all
from autotune.planner.fragmentation import workload_classes
from autotune.planner.jobs import PreparedJob, block_sizes, mixable
from autotune.planner.matching import commit, solve_round
from autotune.planner.packing import pack_greedy, pack_mixed, pack_split, split_of
from autotune.planner.pending import PendingJobs
from autotune.planner.reasons import unplaced_reason, waiting_reason


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
    mixed: dict[str, str] = field(default_factory=dict)
    """Jobs placed on several GPU models (``mix_models``) -> why it pays."""


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
    mix_models: bool = False,
    pack: bool = False,
    splits: Mapping[str, Mapping[str, int]] | None = None,
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

    ``mix_models``: a data-parallel job that no one GPU model has room for may take free
    GPUs of several (``packing.pack_mixed``) where the performance model says that runs
    it faster than the free GPUs of its best model alone; for backends whose jobs take
    batch shares by speed. Those that no one model can take at all (the check above)
    take what the rounds leave free, after them, so mixing never moves another job's
    placement; those the rounds could not place on one model try where the packing
    fallback does.

    ``pack``: every job that the packing fallback can place (whole GPUs, no tensor
    parallelism, may span nodes) is placed by it, in queue order, before the rounds: on
    the nodes of its first allowed model with room, those with the most free GPUs first
    (``packing.pack_greedy``), as Pollux's and Sia's simulators place jobs. The rounds
    place the others.

    ``splits``: jobs whose ranks the caller splits across GPU models (GPU model ->
    ranks; a policy's ``PolicyChoice.gpu_split``): each takes that many free GPUs of
    every model named (``packing.pack_split``: the nodes with the most free first),
    before anything else new is placed, or waits with the reason; a running one keeps
    its placement only where it holds that split.
    """
    started = time.perf_counter()
    if round_size < 1:
        raise ValueError(f"round_size={round_size!r}: must be >= 1")
    current = current or {}
    state = FreeCapacity.of(nodes)
    placements: dict[str, Placement] = {}
    mixed: dict[str, str] = {}
    kept: set[str] = set()
    pending: list[PreparedJob] = []
    if reserved:
        by_id = {j.job_id: j for j in jobs}
        for job_id, fixed in reserved.items():
            reserve_placement(state, by_id[job_id], fixed)
            placements[job_id] = fixed
            kept.add(job_id)
        jobs = [j for j in jobs if j.job_id not in reserved]
    prepared, unplaced = prepare_all(jobs, configs, state)
    splits = splits or {}
    # Running jobs keep what still holds before anything new is placed.
    for job in prepared:
        placement = current.get(job.spec.job_id)
        split = splits.get(job.spec.job_id)
        if (
            placement is not None
            and (split is None or split_of(placement, state) == dict(split))
            and keep_placement(job, placement, state)
        ):
            placements[job.spec.job_id] = placement
            kept.add(job.spec.job_id)
        else:
            job.current = placement
            pending.append(job)
    if splits:  # split by the caller: placed as asked, before the others
        rest: list[PreparedJob] = []
        for job in pending:
            split = splits.get(job.spec.job_id)
            if split is None:
                rest.append(job)
                continue
            found = pack_split(job, state, split)
            if isinstance(found, str):
                unplaced[job.spec.job_id] = found
            else:
                placements[job.spec.job_id] = found
                parts = " + ".join(f"{n}x{m}" for m, n in split.items())
                mixed[job.spec.job_id] = f"across GPU models as chosen: {parts}"
        pending = rest
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
            mixed=mixed,
        )
    tracker = PendingJobs(pending, state)
    # The cluster only fills from here on: a job asking for more GPUs than are free
    # for it now never fits in this plan (on one model: with ``mix_models``, one that
    # may mix tries the GPUs the rounds leave free, after them).
    mixing: list[tuple[PreparedJob, str]] = []  # with why one model cannot take it now
    for job, have in tracker.cannot_fit():
        if mix_models and mixable(job):
            mixing.append((job, waiting_reason(job, have, state)))
        else:
            unplaced[job.spec.job_id] = waiting_reason(job, have, state)
    if pack:
        for job in pending:
            if tracker.alive[job.index] and (packed := pack_greedy(job, state)) is not None:
                placements[job.spec.job_id] = packed
                tracker.settle(job)
    queue: deque[PreparedJob] = deque(job for job in pending if tracker.alive[job.index])
    cost_model = (
        CostModel(state, workload_classes(pending, len(state.models)), weights or CostWeights())
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
        outcome = solve_round(batch, cost_model, tracker.pressure())
        rounds += 1
        total_cost += outcome.cost
        matched = [(batch[p], outcome.nodes[p]) for p in sorted(outcome.nodes)]
        for (job, _), placement in zip(matched, commit(matched, cost_model), strict=True):
            placements[job.spec.job_id] = placement
            tracker.settle(job)
        reasons: dict[tuple[tuple[int, int, int, int], int, bytes], str] = {}
        retry: list[PreparedJob] = []
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
                    for b in block_sizes(job, state.max_gpus_per_node(job.allowed))
                    if b < job.block
                ]
                if smaller:
                    job.set_block(smaller[0])
                    retry.append(job)
                elif (packed := pack_greedy(job, state)) is not None:
                    # 6. No equal blocks fit: the free GPUs as they are, before later jobs.
                    placements[job.spec.job_id] = packed
                    tracker.settle(job)
                elif (
                    mix := pack_mixed(job, state) if mix_models else None
                ) is not None and mix.placement is not None:
                    # 6a. No one model has room: several, where that pays.
                    placements[job.spec.job_id] = mix.placement
                    mixed[job.spec.job_id] = mix.why
                    tracker.settle(job)
                else:
                    # The state is the same for the whole loop: equal requests, equal reasons.
                    key = (job.shape, job.units, job.allowed.tobytes())
                    reason = reasons.get(key)
                    if reason is None:
                        reason = reasons[key] = unplaced_reason(job, state)
                    if mix is not None:
                        reason = f"{reason}; not mixed: {mix.why}"
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
    for job, waiting in mixing:  # in queue order, on what the rounds left
        mix = pack_mixed(job, state)
        if mix is not None and mix.placement is not None:
            placements[job.spec.job_id] = mix.placement
            mixed[job.spec.job_id] = mix.why
        else:
            unplaced[job.spec.job_id] = f"{waiting}; not mixed: {mix.why}" if mix else waiting
    return PlanResult(
        placements=placements,
        unplaced=unplaced,
        kept=frozenset(kept),
        rounds=rounds,
        total_cost=total_cost,
        solve_s=time.perf_counter() - started,
        mixed=mixed,
    )
