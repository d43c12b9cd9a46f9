"""The simulated cluster runs one data-parallel job across GPU models at the pace the
performance model gives balanced batch shares, and says whether it does so
(``ClusterSnapshot.mixes_models``)."""

from __future__ import annotations

from dataclasses import replace

from helpers import next_snapshot

from autotune.catalog.devices import node_info
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobConfig, JobSpec
from autotune.decision.step import decide
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import JobSubmission, PolicyChoice
from autotune.perf.model import shape_of

NODES = tuple(
    node_info(node_id, gpu_model=model, gpu_count=4, cpu_milli=64_000, memory_mib=500_000)
    for node_id, model in (("h0", "H100"), ("h1", "H100"), ("v0", "V100M32"))
)


def test_a_mixed_job_runs_at_its_balanced_pace() -> None:
    cluster = SimulatedCluster(
        SimConfig(nodes=NODES, noise=False, initial_jobs=0, max_jobs=0, mix_models=True)
    )
    spec = JobSpec(
        job_id="j", model=MODEL_CATALOG["resnet-50"], min_gpus=12, max_gpus=12, global_batch=768
    )
    cluster.submit(JobSubmission(spec=spec, task="resnet-50", steps=10**7))
    snapshot = next_snapshot(cluster)
    assert snapshot.mixes_models
    config = JobConfig.data_parallel(12)
    round_ = decide(
        snapshot,
        {"j": PolicyChoice(config=config, reason="twelve")},
        {},
        honoured={},
        policy_version="t",
    )
    (decision,) = round_.decisions
    assert decision.placement is not None
    shape = shape_of(decision.placement, {n.node_id: n for n in NODES}, balanced=True)
    assert shape.mixed
    cluster.apply([decision])
    cluster.run_round()
    cluster.run_round()
    (job,) = cluster.observe().jobs
    balanced = cluster.estimate_for("j", config, shape).step.samples_per_s
    even = cluster.estimate_for("j", config, replace(shape, balanced=False)).step.samples_per_s
    assert job.samples_per_s == balanced
    assert balanced > 1.5 * even  # an even share would hold the H100 ranks to V100 pace
    assert not next_snapshot(SimulatedCluster(SimConfig(initial_jobs=0))).mixes_models
