"""Placement on a real 3-node Ray cluster (``ray.cluster_utils.Cluster``, all on this
machine): every rank runs on the node the Planner chose for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from autotune.core import JobConfig, JobSpec, Layout, NodeInfo, Placement, RankSlot
from autotune.executor.cluster import ray_nodes
from autotune.executor.runner import ExecutorError, JobRunner, RunnerConfig
from autotune.planner import plan
from autotune.ray_session import ensure_ray

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[NodeInfo]]:
    # A driver joins one Ray at a time: leave the test run's local Ray (the next test that
    # needs it starts it again) and join the 3-node cluster.
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        assert ensure_ray(cluster.address)
        yield ray_nodes()
    finally:
        ray.shutdown()
        cluster.shutdown()


def where(placement: Placement) -> list[tuple[int, str]]:
    return [(slot.rank, slot.node_id) for slot in placement.ranks]


def test_ray_nodes_are_the_cluster(nodes: list[NodeInfo]) -> None:
    assert len(nodes) == 3
    assert {n.gpu_model for n in nodes} == {"CPU"}
    assert all(n.gpu_count == 2 for n in nodes)


def test_every_rank_runs_where_the_planner_put_it(nodes: list[NodeInfo]) -> None:
    # One node is half taken by another job, so the Planner has to choose.
    busy = Placement(
        job_id="other", ranks=(RankSlot(rank=0, node_id=nodes[0].node_id, gpu_index=0),)
    )
    spec = JobSpec(job_id="train", min_gpus=4, max_gpus=4)
    other = JobSpec(job_id="other", min_gpus=1, max_gpus=1)
    config = JobConfig(layout=Layout(world_size=4, dp=2, tp=2))
    result = plan(
        [other, spec],
        nodes,
        {"train": config, "other": JobConfig(layout=Layout(world_size=1))},
        current={"other": busy},
    )
    chosen = result.placements["train"]
    ran = JobRunner(RunnerConfig(task="gpt-char", steps=2), config, placement=chosen).run()
    assert [(p["rank"], p["node"]) for p in ran.placement] == where(chosen)
    assert len(ran.losses) == 2


def test_a_hand_made_placement_is_honoured(nodes: list[NodeInfo]) -> None:
    reverse = Placement(
        job_id="train",
        ranks=tuple(RankSlot(rank=i, node_id=nodes[2 - i].node_id, gpu_index=0) for i in range(3)),
    )
    config = JobConfig(layout=Layout(world_size=3))
    ran = JobRunner(RunnerConfig(task="mlp-synthetic", steps=2), config, placement=reverse).run()
    assert [(p["rank"], p["node"]) for p in ran.placement] == where(reverse)


def test_a_placement_that_does_not_fit_is_refused(nodes: list[NodeInfo]) -> None:
    crowded = Placement(
        job_id="train",
        ranks=tuple(RankSlot(rank=i, node_id=nodes[0].node_id, gpu_index=i) for i in range(3)),
    )
    runner = JobRunner(
        RunnerConfig(task="mlp-synthetic", steps=1, batch_size=48, placement_timeout_s=10),
        JobConfig(layout=Layout(world_size=3)),
        placement=crowded,
    )
    with pytest.raises(ExecutorError, match="could not reserve 3 rank slots"):
        runner.run()
