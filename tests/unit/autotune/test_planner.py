"""The Planner against a brute-force optimum, and its constraints on random instances.

The oracle here is written independently of the Planner's vectorised code: a plain-loop
fragmentation measure, the cost terms from their definitions, and exhaustive search over
every assignment of jobs to nodes and GPUs.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from planner_helpers import (
    assert_valid,
    cluster,
    jobs_strategy,
    nodes_strategy,
    running,
)

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import (
    MILLI_PER_GPU,
    JobConfig,
    JobSpec,
    Layout,
    NodeInfo,
    Placement,
    PrecisionMap,
    RankSlot,
)
from autotune.perf.memory import rank_memory
from autotune.perf.model import effective_peak_tflops
from autotune.planner import UNPLACED_COST, CostWeights, FreeCapacity, first_fit, plan
from autotune.planner.costs import CostModel
from autotune.planner.feasibility import prepare_all
from autotune.planner.fragmentation import workload_classes
from autotune.planner.jobs import PreparedJob
from autotune.planner.matching import round_costs
from autotune.planner.pending import pressure_by_model

# --------------------------------------------------------------------------------------
# The oracle
# --------------------------------------------------------------------------------------


def fragmentation(free: list[int], cpu: int, mem: int, model: str, classes: list[tuple]) -> float:  # type: ignore[type-arg]
    """Expected free GPU milli a request drawn from ``classes`` could not use."""
    total = sum(free)
    expected = 0.0
    for weight, gpus, milli, c_cpu, c_mem, allowed in classes:
        usable = [f for f in free if f >= milli]
        fits = model in allowed and len(usable) >= gpus and cpu >= c_cpu and mem >= c_mem
        expected += weight * (sum(f for f in free if f < milli) if fits else total)
    return expected


def brute_force(
    jobs: list[JobSpec], nodes: list[NodeInfo], weights: CostWeights
) -> tuple[int, float, set[str]]:
    """(unplaced jobs, total cost) of the best assignment of jobs to distinct nodes,
    and the jobs that fit nowhere at all."""
    config = {j.job_id: JobConfig.data_parallel(j.min_gpus) for j in jobs}
    present = sorted({n.gpu_model for n in nodes})
    rep = {m: next(n for n in nodes if n.gpu_model == m) for m in present}

    def allowed(job: JobSpec) -> set[str]:
        out = set()
        for m in present:
            if not job.allows(m):
                continue
            if not any(
                n.gpu_model == m
                and n.gpu_count >= job.min_gpus
                and n.cpu_milli >= job.cpu_milli
                and n.memory_mib >= job.memory_mib
                for n in nodes
            ):
                continue  # no node of this model could ever host it
            if job.model is not None and not rank_memory(
                job.model, config[job.job_id], job.global_batch
            ).fits(rep[m].gpu_memory_bytes, job.gpu_milli):
                continue
            out.add(m)
        return out

    ok = {j.job_id: allowed(j) for j in jobs}
    hopeless = {j.job_id for j in jobs if not ok[j.job_id]}
    live = [j for j in jobs if j.job_id not in hopeless]

    def unit_cpu(j: JobSpec) -> int:
        return j.cpu_milli

    # workload classes: host requests rounded up to 1 core and 1 GiB
    counts: dict[tuple, int] = {}  # type: ignore[type-arg]
    for j in live:
        key = (
            j.min_gpus,
            j.gpu_milli,
            math.ceil(j.cpu_milli / 1000) * 1000,
            math.ceil(j.memory_mib / 1024) * 1024,
            frozenset(ok[j.job_id]),
        )
        counts[key] = counts.get(key, 0) + j.min_gpus * j.gpu_milli  # GPU demand
    total = sum(counts.values())
    classes = [(c / total, *key) for key, c in counts.items()]

    # pressure: demand spread over allowed models in proportion to their free GPUs
    free_by_model = {m: float(sum(n.gpu_count for n in nodes if n.gpu_model == m)) for m in present}
    demand = dict.fromkeys(present, 0.0)
    for j in live:
        share = sum(free_by_model[m] for m in ok[j.job_id])
        for m in ok[j.job_id]:
            demand[m] += j.min_gpus * j.gpu_milli / 1000 * free_by_model[m] / share
    pressure = {m: demand[m] / free_by_model[m] for m in present}

    def per_model_cost(j: JobSpec, m: str) -> float:
        gpus = j.min_gpus
        cost = weights.scarcity * pressure[m] * gpus * j.gpu_milli / 1000
        if j.model is not None:
            cfg = config[j.job_id]
            best = max(effective_peak_tflops(rep[a], cfg.precision) for a in present if j.allows(a))
            cost += (
                weights.compute * gpus * (best / effective_peak_tflops(rep[m], cfg.precision) - 1)
            )
            used = rank_memory(j.model, cfg, j.global_batch).total_bytes / (
                rep[m].gpu_memory_bytes * j.gpu_milli / 1000
            )
            cost += weights.memory_headroom * gpus * max(0.0, used - 0.9) / 0.1
        return cost

    def options(j: JobSpec, n: NodeInfo) -> list[float]:
        if (
            n.gpu_model not in ok[j.job_id]
            or n.cpu_milli < unit_cpu(j)
            or n.memory_mib < j.memory_mib
        ):
            return []
        free = [1000] * n.gpu_count
        before = fragmentation(free, n.cpu_milli, n.memory_mib, n.gpu_model, classes)
        picks = (
            [[g] for g in range(n.gpu_count)]
            if j.min_gpus == 1
            else [list(range(j.min_gpus))]
            if j.min_gpus <= n.gpu_count
            else []
        )
        costs = []
        for gpus in picks:
            after_free = [f - j.gpu_milli if g in gpus else f for g, f in enumerate(free)]
            after = fragmentation(
                after_free,
                n.cpu_milli - unit_cpu(j),
                n.memory_mib - j.memory_mib,
                n.gpu_model,
                classes,
            )
            costs.append(
                weights.fragmentation * (after - before) / 1000 + per_model_cost(j, n.gpu_model)
            )
        return costs

    best = (len(live) + 1, math.inf)
    choices = [[None, *list(range(len(nodes)))] for _ in live]
    for assignment in itertools.product(*choices):
        used = [a for a in assignment if a is not None]
        if len(used) != len(set(used)):
            continue
        cost, unplaced, feasible = 0.0, 0, True
        for j, a in zip(live, assignment, strict=True):
            if a is None:
                unplaced += 1
                continue
            opts = options(j, nodes[a])
            if not opts:
                feasible = False
                break
            cost += min(opts)
        if feasible and (unplaced, cost) < best:
            best = (unplaced, cost)
    return best[0], best[1], hopeless


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_strategy(), jobs=jobs_strategy())
def test_one_round_total_cost_equals_brute_force_optimum(
    nodes: list[NodeInfo], jobs: list[JobSpec]
) -> None:
    weights = CostWeights()
    unplaced, optimum, hopeless = brute_force(jobs, nodes, weights)
    # When the best assignment places every job, one round must find it.
    assume(unplaced == 0)
    result = plan(jobs, nodes, {})
    assert set(result.unplaced) == hopeless
    assert set(result.placements) == {j.job_id for j in jobs} - hopeless
    assert result.rounds == (1 if len(hopeless) < len(jobs) else 0)
    assert result.total_cost == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    assert_valid(jobs, nodes, {}, result.placements)


@settings(max_examples=150, deadline=None)
@given(nodes=nodes_strategy(max_nodes=3), jobs=jobs_strategy(max_jobs=10))
def test_constraints_hold_and_every_job_is_accounted_for(
    nodes: list[NodeInfo], jobs: list[JobSpec]
) -> None:
    result = plan(jobs, nodes, {}, round_size=3)
    assert set(result.placements) | set(result.unplaced) == {j.job_id for j in jobs}
    assert not set(result.placements) & set(result.unplaced)
    assert all(reason for reason in result.unplaced.values())
    assert_valid(jobs, nodes, {}, result.placements)
    again = plan(jobs, nodes, {}, round_size=3)
    assert again.placements == result.placements, "planning is not deterministic"


@settings(max_examples=60, deadline=None)
@given(nodes=nodes_strategy(), jobs=jobs_strategy(max_jobs=8))
def test_first_fit_obeys_the_same_constraints(nodes: list[NodeInfo], jobs: list[JobSpec]) -> None:
    result = first_fit(jobs, nodes, {})
    assert set(result.placements) | set(result.unplaced) == {j.job_id for j in jobs}
    assert_valid(jobs, nodes, {}, result.placements)


@settings(max_examples=40, deadline=None)
@given(nodes=nodes_strategy(max_nodes=3), jobs=jobs_strategy(max_jobs=8))
def test_plans_on_an_unchanged_cluster_reuse_its_shape_and_start_all_free(
    nodes: list[NodeInfo], jobs: list[JobSpec]
) -> None:
    """A tuple of nodes planned on again (an environment's rounds) reuses what was built
    from it: each plan still starts from every GPU free and equals a plan on a list."""
    shape = tuple(nodes)
    fresh = plan(jobs, list(nodes), {})
    for _ in range(2):
        again = plan(jobs, shape, {})
        assert again.placements == fresh.placements
        assert again.unplaced == fresh.unplaced
    first, second = FreeCapacity.of(shape), FreeCapacity.of(shape)
    assert first.free_milli is not second.free_milli
    assert first.shape_key() is second.shape_key()
    if nodes[0].gpu_count:
        first.take(0, [0], 1000, 0, 0)
        assert FreeCapacity.of(shape).free_milli[0, 0] == 1000


def test_gang_all_ranks_or_none() -> None:
    nodes = cluster(("A100", 2))
    jobs = [
        JobSpec(job_id="big", min_gpus=4, max_gpus=4, submitted_at=0),
        JobSpec(job_id="small", min_gpus=1, max_gpus=1, submitted_at=1),
    ]
    result = plan(jobs, nodes, {"big": JobConfig.data_parallel(4)})
    assert "big" in result.unplaced
    assert result.unplaced["big"].startswith("no capacity")
    assert set(result.placements) == {"small"}


def test_multi_node_job_is_split_in_node_sized_blocks_and_tp_groups_stay_local() -> None:
    nodes = cluster(("A100", 4), ("A100", 4), ("A100", 4))
    blocker = JobSpec(job_id="blocker", min_gpus=2, max_gpus=2, max_nodes=1, submitted_at=0)
    job = JobSpec(job_id="tp", min_gpus=8, max_gpus=8, submitted_at=1)
    configs = {"tp": JobConfig(layout=Layout(world_size=8, tp=2))}
    result = plan([blocker, job], nodes, configs)
    assert set(result.placements) == {"blocker", "tp"}
    assert_valid([blocker, job], nodes, configs, result.placements)
    # 8 ranks over 4-GPU nodes with one node half taken: two whole nodes.
    assert len(result.placements["tp"].nodes) == 2
    assert "n0" not in result.placements["tp"].nodes or "n1" not in result.placements["tp"].nodes


def test_a_job_no_equal_blocks_fit_takes_the_free_gpus_as_they_are() -> None:
    """6 ranks on 4-GPU nodes with 4, 1 and 1 GPUs free: no 3, 2 or 1-GPU blocks fit
    (one node each), but the GPUs are idle: the packing fallback places 4 + 1 + 1, the
    emptiest node first."""
    nodes = cluster(("A100", 4), ("A100", 4), ("A100", 4))
    blockers = [
        Placement(
            job_id=f"b{n}",
            ranks=tuple(RankSlot(rank=r, node_id=f"n{n}", gpu_index=r) for r in range(3)),
        )
        for n in (1, 2)
    ]
    jobs = [
        *(JobSpec(job_id=p.job_id, min_gpus=3, max_gpus=3, submitted_at=0) for p in blockers),
        JobSpec(job_id="six", min_gpus=6, max_gpus=6, submitted_at=1),
    ]
    configs = {
        "b1": JobConfig.data_parallel(3),
        "b2": JobConfig.data_parallel(3),
        "six": JobConfig.data_parallel(6),
    }
    result = plan(jobs, nodes, configs, {p.job_id: p for p in blockers})
    assert_valid(jobs, nodes, configs, result.placements)
    six = result.placements["six"]
    per_node = {n: sum(1 for s in six.ranks if s.node_id == n) for n in six.nodes}
    assert per_node == {"n0": 4, "n1": 1, "n2": 1}
    # With tensor parallelism the ranks of a group must share a node: no fallback.
    configs["six"] = JobConfig(layout=Layout(world_size=6, tp=2))
    tp = plan(jobs, nodes, configs, {p.job_id: p for p in blockers})
    assert tp.unplaced["six"].startswith("no capacity")


def test_fractional_jobs_share_a_gpu_up_to_1000_milli() -> None:
    nodes = cluster(("T4", 1))
    jobs = [JobSpec(job_id=f"s{i}", gpu_milli=400, submitted_at=i) for i in range(3)]
    result = plan(jobs, nodes, {})
    assert set(result.placements) == {"s0", "s1"}
    assert {p.ranks[0].gpu_index for p in result.placements.values()} == {0}
    assert "s2" in result.unplaced
    assert_valid(jobs, nodes, {}, result.placements)


def test_gpu_type_constraints_are_honoured_or_reported() -> None:
    nodes = cluster(("A100", 4), ("T4", 4))
    jobs = [
        JobSpec(job_id="t4", gpu_types=("T4",), min_gpus=2, max_gpus=2),
        JobSpec(job_id="h100", gpu_types=("H100",)),
    ]
    result = plan(jobs, nodes, {"t4": JobConfig.data_parallel(2)})
    assert result.placements["t4"].nodes == ("n1",)
    assert result.unplaced["h100"] == "no node has an allowed GPU model (H100)"


def test_a_config_that_cannot_fit_memory_comes_back_with_the_reason() -> None:
    nodes = cluster(("A100", 8))
    model = MODEL_CATALOG["gpt-7b"]
    jobs = [
        JobSpec(job_id="dp", model=model, global_batch=8, min_gpus=1, max_gpus=8),
        JobSpec(job_id="tp", model=model, global_batch=8, min_gpus=1, max_gpus=8),
    ]
    bf16 = PrecisionMap.uniform("bf16")
    configs = {
        "dp": JobConfig(layout=Layout(world_size=1)),
        "tp": JobConfig(
            layout=Layout(world_size=8, tp=8, activation_checkpointing=True), precision=bf16
        ),
    }
    result = plan(jobs, nodes, configs)
    assert result.unplaced["dp"].startswith("out of memory: needs ")
    assert "GiB per rank" in result.unplaced["dp"]
    assert set(result.placements) == {"tp"}


def test_running_jobs_keep_their_placement_and_moves_are_avoided() -> None:
    nodes = cluster(("A100", 4), ("A100", 4))
    running = Placement(job_id="r", ranks=(RankSlot(rank=0, node_id="n1", gpu_index=2),))
    jobs = [JobSpec(job_id="r", min_gpus=1, max_gpus=4), JobSpec(job_id="new")]
    result = plan(jobs, nodes, {"r": JobConfig.data_parallel(1)}, {"r": running})
    assert result.placements["r"] == running
    assert result.kept == {"r"}
    # Growing from 1 to 2 GPUs re-places the job; it stays on its node.
    grown = plan(jobs, nodes, {"r": JobConfig.data_parallel(2)}, {"r": running})
    assert "r" not in grown.kept
    assert grown.placements["r"].nodes == ("n1",)


def test_higher_priority_goes_first_when_capacity_is_short() -> None:
    nodes = cluster(("A100", 1))
    jobs = [
        JobSpec(job_id="early", submitted_at=0),
        JobSpec(job_id="urgent", priority=5, submitted_at=9),
    ]
    result = plan(jobs, nodes, {})
    assert set(result.placements) == {"urgent"}


def test_unmatched_cost_exceeds_any_real_entry() -> None:
    # Sanity of the matching's scale: a job on the worst node costs far less than
    # leaving it out, so the matching maximises the units it places.
    nodes = cluster(("T4", 1), ("A100", 8))
    job = JobSpec(job_id="j", model=MODEL_CATALOG["gpt-350m"], global_batch=8)
    result = plan([job], nodes, {}, weights=CostWeights(compute=100.0))
    assert result.total_cost < UNPLACED_COST / 1000


# --------------------------------------------------------------------------------------
# Waiting jobs and the vectorised rounds
# --------------------------------------------------------------------------------------


def test_a_job_larger_than_the_free_gpus_waits_with_the_count_and_smaller_ones_still_fit() -> None:
    nodes = cluster(("A100", 4), ("A100", 4), ("T4", 4))
    jobs = [
        JobSpec(job_id="r0", min_gpus=4, max_gpus=4, submitted_at=0),
        JobSpec(job_id="r1", min_gpus=2, max_gpus=2, submitted_at=1),
        JobSpec(job_id="big", min_gpus=4, max_gpus=4, gpu_types=("A100",), submitted_at=2),
        JobSpec(job_id="small", min_gpus=1, max_gpus=1, gpu_types=("A100",), submitted_at=3),
        JobSpec(job_id="share", gpu_milli=500, gpu_types=("A100",), submitted_at=4),
    ]
    configs = {
        "r0": JobConfig.data_parallel(4),
        "r1": JobConfig.data_parallel(2),
        "big": JobConfig.data_parallel(4),
    }
    current = {"r0": running("r0", "n0", [0, 1, 2, 3]), "r1": running("r1", "n1", [0, 1])}
    result = plan(jobs, nodes, configs, current)
    assert result.kept == {"r0", "r1"}
    # 2 A100 GPUs are free after the kept jobs: the 4-GPU job cannot fit in this plan.
    assert result.unplaced == {"big": "no capacity: waiting for 4 GPU(s) of A100; 2 free"}
    assert set(result.placements) == {"r0", "r1", "small", "share"}
    assert result.placements["small"].nodes == ("n1",)
    assert_valid(jobs, nodes, configs, result.placements)


def test_a_shared_gpu_job_waits_for_a_gpu_with_its_milli_free() -> None:
    nodes = cluster(("T4", 1))
    jobs = [
        JobSpec(job_id="a", gpu_milli=700, submitted_at=0),
        JobSpec(job_id="b", gpu_milli=500, submitted_at=1),
    ]
    current = {
        "a": Placement(
            job_id="a", ranks=(RankSlot(rank=0, node_id="n0", gpu_index=0, gpu_milli=700),)
        )
    }
    result = plan(jobs, nodes, {}, current)
    assert result.kept == {"a"}
    assert result.unplaced == {
        "b": "no capacity: waiting for 1 GPU(s) with 500 milli free of T4; 0 have it"
    }
    assert result.rounds == 0


def test_with_no_gpu_free_running_jobs_are_kept_and_no_round_runs() -> None:
    nodes = cluster(("A100", 2))
    jobs = [
        JobSpec(job_id="r", min_gpus=2, max_gpus=2, submitted_at=0),
        *(JobSpec(job_id=f"p{i}", submitted_at=1 + i) for i in range(3)),
    ]
    configs = {"r": JobConfig.data_parallel(2)}
    result = plan(jobs, nodes, configs, {"r": running("r", "n0", [0, 1])})
    assert result.kept == {"r"}
    assert set(result.placements) == {"r"}
    assert result.rounds == 0
    assert result.unplaced == {
        f"p{i}": "no capacity: waiting for 1 GPU(s) of A100; 0 free" for i in range(3)
    }


def reference_row(
    job: PreparedJob,
    unit: int,
    state: FreeCapacity,
    classes: list[tuple],  # type: ignore[type-arg]
    pressure: Sequence[float],
    weights: CostWeights,
) -> list[float]:
    """One unit's cost on every node from the definitions, node by node and GPU by GPU:
    what the Planner computed row by row before its rounds were vectorised."""
    gpus, milli, cpu, mem = job.shape
    block = job.block
    row: list[float] = []
    for n, node in enumerate(state.nodes):
        m = int(state.model_of[n])
        if m < 0 or not job.allowed[m]:
            row.append(math.inf)
            continue
        free = [int(f) for f in state.free_milli[n][: node.gpu_count]]
        free_cpu = int(state.free_cpu[n])
        free_mem = int(state.free_mem[n])
        model = node.gpu_model
        if free_cpu < cpu or free_mem < mem:
            row.append(math.inf)
            continue
        before = fragmentation(free, free_cpu, free_mem, model, classes)
        if gpus == 1:
            picks = [[g] for g, f in enumerate(free) if f >= milli]
        else:
            whole = [g for g, f in enumerate(free) if f >= MILLI_PER_GPU]
            picks = [whole[:gpus]] if len(whole) >= gpus else []
        if not picks:
            row.append(math.inf)
            continue
        growth = min(
            fragmentation(
                [f - milli if g in pick else f for g, f in enumerate(free)],
                free_cpu - cpu,
                free_mem - mem,
                model,
                classes,
            )
            - before
            for pick in picks
        )
        cost = weights.fragmentation * growth / MILLI_PER_GPU
        cost += weights.scarcity * pressure[m] * block * milli / MILLI_PER_GPU
        cost += weights.compute * job.compute[m] * block
        cost += weights.memory_headroom * job.headroom[m] * block
        current = job.current
        if current is not None:
            stay = sum(
                1
                for s in current.ranks
                if unit * block <= s.rank < (unit + 1) * block and s.node_id == node.node_id
            )
            cost += weights.moving * (block - stay)
        row.append(cost)
    return row


@settings(max_examples=40, deadline=None)
@given(
    nodes=nodes_strategy(max_nodes=5),
    jobs=jobs_strategy(max_jobs=6),
    seed=st.integers(0, 2**16),
    multi=st.booleans(),
)
def test_vectorised_round_costs_equal_the_per_unit_definition(
    nodes: list[NodeInfo], jobs: list[JobSpec], seed: int, multi: bool
) -> None:
    rng = random.Random(seed)
    if multi:  # jobs over several nodes in blocks, some of them running somewhere
        jobs = [
            *jobs,
            JobSpec(job_id="m0", min_gpus=4, max_gpus=4, cpu_milli=4000, submitted_at=10),
            JobSpec(job_id="m1", min_gpus=2, max_gpus=2, gpu_types=("A100", "T4"), submitted_at=11),
        ]
    state = FreeCapacity(nodes)
    # Some capacity already taken, whole and shared GPUs.
    for n, node in enumerate(nodes):
        for g in range(node.gpu_count):
            if rng.random() < 0.4:
                state.take(n, [g], rng.choice([300, 500, 1000]), 0, 0)
        state.take(n, [], 0, rng.choice([0, 1000, 4000]), rng.choice([0, 4096]))
    prepared, _ = prepare_all(jobs, {}, state)
    assume(prepared)
    for job in prepared:
        if job.world > 1 and job.spec.max_nodes != 1:
            job.set_block(1)  # several units per job
        if rng.random() < 0.5:  # running somewhere: the moving term counts
            job.current = Placement(
                job_id=job.spec.job_id,
                ranks=tuple(
                    RankSlot(
                        rank=r,
                        node_id=rng.choice(nodes).node_id,
                        gpu_index=r,
                        gpu_milli=job.spec.gpu_milli,
                    )
                    for r in range(job.world)
                ),
            )
    weights = CostWeights(moving=rng.choice([0.0, 2.0, 3.5]))
    c = workload_classes(prepared, len(state.models))
    classes = [
        (
            float(c.weight[k]),
            int(c.gpus[k]),
            int(c.milli[k]),
            int(c.cpu[k]),
            int(c.mem[k]),
            {m for i, m in enumerate(state.models) if c.allowed[k, i]},
        )
        for k in range(len(c.weight))
    ]
    pressure = pressure_by_model(prepared, state)
    costs = round_costs(prepared, CostModel(state, c, weights), pressure)
    unit_rows = costs.rows[costs.row_of]
    assert len(unit_rows) == sum(job.units for job in prepared)
    r = 0
    for position, job in enumerate(prepared):
        for unit in range(job.units):
            assert costs.owner[r] == position
            expected = reference_row(job, unit, state, classes, pressure.tolist(), weights)
            assert unit_rows[r].tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)
            r += 1
