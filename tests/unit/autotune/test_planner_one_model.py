"""The Planner puts all of a job's ranks on one GPU model, on mixed clusters partly
busy, moving or not."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from planner_helpers import assert_valid, jobs_strategy, nodes_strategy, running

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import (
    JobConfig,
    JobSpec,
    Layout,
    NodeInfo,
    Placement,
    RankSlot,
)
from autotune.envs.presets import default_nodes
from autotune.perf.model import shape_of
from autotune.planner import plan

# --------------------------------------------------------------------------------------
# One GPU model per job
# --------------------------------------------------------------------------------------


def models_of(placement: Placement, nodes: Sequence[NodeInfo]) -> set[str]:
    by_id = {n.node_id: n for n in nodes}
    return {by_id[node].gpu_model for node in placement.nodes}


def test_a_multi_node_job_runs_on_one_gpu_model_of_a_partly_busy_mixed_cluster() -> None:
    # default_nodes(): 2 x 8 A100, 8 V100M32, 2 x 4 T4. Running jobs leave 4 A100 GPUs
    # free on each A100 node and none on the V100 node; the T4 nodes are free. The
    # 8-GPU job cannot have one node, so it goes in two blocks of 4, and the 4-GPU job
    # takes an A100 node first: 4 A100 + 4 T4 GPUs would run at T4 pace.
    nodes = default_nodes()
    model = MODEL_CATALOG["gpt-350m"]
    jobs = [
        JobSpec(job_id="ra", min_gpus=4, max_gpus=4, submitted_at=0),
        JobSpec(job_id="rb", min_gpus=4, max_gpus=4, submitted_at=1),
        JobSpec(job_id="rv", min_gpus=8, max_gpus=8, submitted_at=2),
        JobSpec(job_id="big", model=model, global_batch=8, min_gpus=8, max_gpus=8, submitted_at=3),
        JobSpec(
            job_id="small", model=model, global_batch=8, min_gpus=4, max_gpus=4, submitted_at=4
        ),
    ]
    configs = {j.job_id: JobConfig.data_parallel(j.min_gpus) for j in jobs}
    current = {
        "ra": running("ra", "a100-0", range(4)),
        "rb": running("rb", "a100-1", range(4)),
        "rv": running("rv", "v100-0", range(8)),
    }
    result = plan(jobs, nodes, configs, current)
    assert set(result.placements) == {"ra", "rb", "rv", "big", "small"}
    assert_valid(jobs, nodes, configs, result.placements)
    big = result.placements["big"]
    assert len(big.nodes) == 2
    assert models_of(big, nodes) == {"T4"}
    # Its pace is that of every one of its GPUs.
    assert shape_of(big, {n.node_id: n for n in nodes}).gpu_model == "T4"
    assert models_of(result.placements["small"], nodes) == {"A100"}


def test_a_multi_node_job_takes_the_fastest_model_with_room_for_all_its_units() -> None:
    nodes = default_nodes()
    model = MODEL_CATALOG["gpt-350m"]
    jobs = [
        JobSpec(job_id="ra", min_gpus=4, max_gpus=4, submitted_at=0),
        JobSpec(job_id="rb", min_gpus=4, max_gpus=4, submitted_at=1),
        JobSpec(job_id="rv", min_gpus=4, max_gpus=4, submitted_at=2),
        JobSpec(job_id="big", model=model, global_batch=8, min_gpus=8, max_gpus=8, submitted_at=3),
    ]
    configs = {j.job_id: JobConfig.data_parallel(j.min_gpus) for j in jobs}
    current = {
        "ra": running("ra", "a100-0", range(4)),
        "rb": running("rb", "a100-1", range(4)),
        "rv": running("rv", "v100-0", range(4)),
    }
    result = plan(jobs, nodes, configs, current)
    assert models_of(result.placements["big"], nodes) == {"A100"}
    assert_valid(jobs, nodes, configs, result.placements)


def test_a_moving_multi_node_job_stays_on_one_model_and_keeps_a_node() -> None:
    nodes = default_nodes()
    model = MODEL_CATALOG["gpt-350m"]
    jobs = [
        JobSpec(job_id="ra", min_gpus=4, max_gpus=4, submitted_at=0),
        JobSpec(job_id="rb", min_gpus=4, max_gpus=4, submitted_at=1),
        JobSpec(job_id="rv", min_gpus=8, max_gpus=8, submitted_at=2),
        JobSpec(job_id="grow", model=model, global_batch=8, min_gpus=4, max_gpus=8, submitted_at=3),
    ]
    configs = {j.job_id: JobConfig.data_parallel(j.min_gpus) for j in jobs}
    configs["grow"] = JobConfig.data_parallel(8)  # from 4 GPUs to 8: it is placed anew
    current = {
        "ra": running("ra", "a100-0", range(4)),
        "rb": running("rb", "a100-1", range(4)),
        "rv": running("rv", "v100-0", range(8)),
        "grow": running("grow", "a100-0", range(4, 8)),
    }
    result = plan(jobs, nodes, configs, current)
    assert "grow" not in result.kept
    grown = result.placements["grow"]
    assert models_of(grown, nodes) == {"A100"}
    assert "a100-0" in grown.nodes
    assert_valid(jobs, nodes, configs, result.placements)


def test_a_job_waits_when_no_single_model_has_room_though_the_gpus_exist_across_models() -> None:
    # 8 GPUs are free, 6 A100 and 2 T4, but no model has 8 free.
    nodes = default_nodes()
    jobs = [
        JobSpec(job_id="ra", min_gpus=8, max_gpus=8, submitted_at=0),
        JobSpec(job_id="rb", min_gpus=2, max_gpus=2, submitted_at=1),
        JobSpec(job_id="rv", min_gpus=8, max_gpus=8, submitted_at=2),
        JobSpec(job_id="rt", min_gpus=6, max_gpus=6, submitted_at=3),
        JobSpec(job_id="big", min_gpus=8, max_gpus=8, submitted_at=4),
    ]
    configs = {j.job_id: JobConfig.data_parallel(j.min_gpus) for j in jobs}
    current = {
        "ra": running("ra", "a100-0", range(8)),
        "rb": running("rb", "a100-1", range(2)),
        "rv": running("rv", "v100-0", range(8)),
        "rt": Placement(
            job_id="rt",
            ranks=tuple(
                RankSlot(rank=r, node_id=f"t4-{r // 4}", gpu_index=r % 4) for r in range(6)
            ),
        ),
    }
    result = plan(jobs, nodes, configs, current)
    assert result.kept == {"ra", "rb", "rv", "rt"}
    assert result.unplaced == {
        "big": "no capacity: waiting for 8 GPU(s) of one model "
        "(A100: 6 free, T4: 2 free, V100M32: 0 free)"
    }
    assert result.rounds == 0


def test_a_job_whose_blocks_fit_no_single_model_is_unplaced_with_the_count_per_model() -> None:
    # 8 A100 GPUs are free, as 6 + 2, and 6 T4, as 4 + 2: blocks of 4 ranks (tp=4) need
    # two nodes with 4 free of one model; each model has one.
    nodes = default_nodes()
    jobs = [
        JobSpec(job_id="ra", min_gpus=2, max_gpus=2, submitted_at=0),
        JobSpec(job_id="rb", min_gpus=6, max_gpus=6, submitted_at=1),
        JobSpec(job_id="rv", min_gpus=8, max_gpus=8, submitted_at=2),
        JobSpec(job_id="rt", min_gpus=2, max_gpus=2, submitted_at=3),
        JobSpec(job_id="tp", min_gpus=8, max_gpus=8, max_nodes=2, submitted_at=4),
    ]
    configs = {j.job_id: JobConfig.data_parallel(j.min_gpus) for j in jobs}
    configs["tp"] = JobConfig(layout=Layout(world_size=8, tp=4))
    current = {
        "ra": running("ra", "a100-0", range(2)),
        "rb": running("rb", "a100-1", range(6)),
        "rv": running("rv", "v100-0", range(8)),
        "rt": running("rt", "t4-1", range(2)),
    }
    result = plan(jobs, nodes, configs, current)
    assert result.unplaced == {
        "tp": "no capacity: needs 2 node(s) with 4 free GPU(s) of one allowed model; "
        "A100: 1, T4: 1, V100M32: 0 have it"
    }


@settings(max_examples=80, deadline=None)
@given(
    nodes=nodes_strategy(max_nodes=6),
    pods=jobs_strategy(max_jobs=4),
    sizes=st.lists(st.integers(2, 8), min_size=1, max_size=4),
    typed=st.booleans(),
)
def test_every_multi_node_job_is_placed_on_one_gpu_model(
    nodes: list[NodeInfo], pods: list[JobSpec], sizes: list[int], typed: bool
) -> None:
    spanning = [
        JobSpec(
            job_id=f"m{i}",
            model=MODEL_CATALOG["gpt-350m"] if i % 2 else None,
            global_batch=8 * size,
            min_gpus=size,
            max_gpus=size,
            gpu_types=("A100", "T4") if typed and i % 2 == 0 else None,
            cpu_milli=1000 * size,
            submitted_at=0.5 + i,
        )
        for i, size in enumerate(sizes)
    ]
    jobs = [*pods, *spanning]
    result = plan(jobs, nodes, {}, round_size=4)
    assert set(result.placements) | set(result.unplaced) == {j.job_id for j in jobs}
    assert_valid(jobs, nodes, {}, result.placements)
    for job in spanning:
        placement = result.placements.get(job.job_id)
        if placement is not None:
            assert len(models_of(placement, nodes)) == 1, placement
