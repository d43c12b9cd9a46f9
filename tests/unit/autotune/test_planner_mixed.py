"""One data-parallel job across GPU models (``plan(mix_models=True)``): the performance
model prices balanced batch shares, the Planner mixes only where no one model has room
and mixing beats the free GPUs of the job's best model alone, and the decision says why."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import cli

from autotune.catalog.devices import node_info
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobConfig, JobSpec, Layout, NodeInfo, Placement, RankSlot
from autotune.decision.step import decide
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice
from autotune.perf.model import (
    DEFAULT_COEFFICIENTS,
    balance_gain,
    rank_batches,
    rank_speed,
    shape_of,
    step_time,
)
from autotune.planner import plan, verify_placements

RESNET = MODEL_CATALOG["resnet-50"]


def _node(node_id: str, model: str, gpus: int = 4) -> NodeInfo:
    return node_info(node_id, gpu_model=model, gpu_count=gpus, cpu_milli=64_000, memory_mib=500_000)


# Two H100 nodes and a V100 node, each of 4 GPUs on the network: a 12-GPU job spans the
# network whether it mixes or not, and the 4 V100 add compute.
SPREAD = [_node("h0", "H100"), _node("h1", "H100"), _node("v0", "V100M32")]
# One H100 node of 8 (NVLink inside) and a V100 node: mixing puts the gradients on the
# network, which the 8 H100 alone never touch.
TOGETHER = [_node("h0", "H100", 8), _node("v0", "V100M32")]


def _placement(*per_node: tuple[str, int]) -> Placement:
    nodes = [node for node, count in per_node for _ in range(count)]
    return Placement(
        job_id="j",
        ranks=tuple(
            RankSlot(rank=r, node_id=n, gpu_index=sum(1 for m in nodes[:r] if m == n))
            for r, n in enumerate(nodes)
        ),
    )


def test_balanced_shares_run_at_the_sum_of_the_ranks_speeds() -> None:
    nodes = {n.node_id: n for n in SPREAD}
    mixed = shape_of(_placement(("h0", 4), ("v0", 4)), nodes)
    assert mixed.gpu_model == "V100M32"  # the slowest, as before
    assert dict(mixed.gpu_models) == {"H100": 4, "V100M32": 4}
    config = JobConfig.data_parallel(8)
    fp32 = config.precision
    fast, slow = rank_speed("H100", RESNET, fp32), rank_speed("V100M32", RESNET, fp32)
    assert fast > 2 * slow
    gain = balance_gain(mixed, RESNET, config)
    assert gain == pytest.approx((4 * fast + 4 * slow) / (8 * slow))
    even = step_time(RESNET, config, replace(mixed, gpu_models=()), 512)  # slowest pace
    balanced = step_time(RESNET, config, mixed, 512)
    overhead = DEFAULT_COEFFICIENTS.compute_overhead_s
    assert balanced.compute_s - overhead == pytest.approx((even.compute_s - overhead) / gain)
    assert balanced.sync_s == even.sync_s  # the gradients cross the same slowest link
    # Each rank's batch share by its speed; together the global batch.
    shares = {m: b // 8 for m, _, b in rank_batches(mixed, RESNET, config, 512)}
    assert shares["H100"] > shares["V100M32"]
    assert 4 * shares["H100"] + 4 * shares["V100M32"] == pytest.approx(512, abs=8)
    # Tensor parallelism is not balanced by batch: the slowest rank's pace.
    tp = JobConfig(layout=Layout(world_size=8, tp=2))
    assert balance_gain(mixed, RESNET, tp) == 1.0


def _job(model: str = "resnet-50", world: int = 12) -> tuple[JobSpec, dict[str, JobConfig]]:
    spec = JobSpec(
        job_id="j", model=MODEL_CATALOG[model], min_gpus=1, max_gpus=world, global_batch=768
    )
    return spec, {"j": JobConfig.data_parallel(world)}


def test_a_job_no_one_model_can_hold_runs_across_models_where_that_pays() -> None:
    spec, configs = _job()
    result = plan([spec], SPREAD, configs, mix_models=True)
    placed = result.placements["j"]
    assert len(placed.ranks) == 12
    assert verify_placements([spec], SPREAD, result.placements) == []
    assert dict(shape_of(placed, {n.node_id: n for n in SPREAD}).gpu_models) == {
        "H100": 8,
        "V100M32": 4,
    }
    why = result.mixed["j"]
    assert why.startswith("on several GPU models (8xH100 + 4xV100M32)")
    assert "against" in why
    assert "on the 8 free H100 alone" in why
    # Without mixing, the one-model rule holds: the job waits.
    assert "j" in plan([spec], SPREAD, configs).unplaced


def test_mixing_is_refused_where_the_best_model_alone_runs_faster() -> None:
    spec, configs = _job()
    result = plan([spec], TOGETHER, configs, mix_models=True)
    assert result.placements == {}
    assert "not mixed: on 8xH100 + 4xV100M32 it would run" in result.unplaced["j"]
    assert "no faster than" in result.unplaced["j"]


def test_only_data_parallel_jobs_of_known_models_mix() -> None:
    spec, _ = _job()
    tensor = {"j": JobConfig(layout=Layout(world_size=12, tp=2))}
    assert plan([spec], SPREAD, tensor, mix_models=True).placements == {}
    opaque = JobSpec(job_id="j", min_gpus=12, max_gpus=12)  # no model: nothing prices it
    assert plan([opaque], SPREAD, {}, mix_models=True).placements == {}


def test_one_model_with_room_is_used_as_before() -> None:
    spec, configs = _job(world=8)
    result = plan([spec], SPREAD, configs, mix_models=True)
    placed = result.placements["j"]
    assert not shape_of(placed, {n.node_id: n for n in SPREAD}).mixed
    assert result.mixed == {}


def test_the_decision_says_why_the_job_was_mixed() -> None:
    spec, configs = _job()
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=tuple(SPREAD),
        jobs=(JobStatus(spec=spec, state="pending"),),
        telemetry="test",
        mixes_models=True,
    )
    choices = {"j": PolicyChoice(config=configs["j"], reason="chosen")}
    round_ = decide(snapshot, choices, {}, honoured={}, policy_version="t")
    (decision,) = round_.decisions
    assert decision.placement is not None
    assert len(decision.placement.ranks) == 12
    assert "on several GPU models (8xH100 + 4xV100M32)" in decision.reason
    assert "on several GPU models" in round_.why["j"].explanation["why"]
    # A backend that cannot balance shares never gets a mixed placement: the job is
    # sized to what one model holds.
    flat = decide(
        replace(snapshot, mixes_models=False), choices, {}, honoured={}, policy_version="t"
    )
    (one,) = flat.decisions
    assert one.placement is not None
    assert not shape_of(one.placement, {n.node_id: n for n in SPREAD}).mixed
    assert "8 GPU(s) instead of 12: one GPU model it may use holds at most 8" in one.reason


def test_the_rules_policy_sizes_a_job_for_the_models_together_where_the_cluster_mixes() -> None:
    from autotune.policies.rules import RulesPolicy

    nodes = (_node("h0", "H100", 2), _node("h1", "H100", 2), _node("v0", "V100M32"))
    spec = JobSpec(job_id="j", model=RESNET, min_gpus=1, max_gpus=8, global_batch=768)
    snapshot = ClusterSnapshot(
        time_s=0.0, nodes=nodes, jobs=(JobStatus(spec=spec, state="pending"),), telemetry="t"
    )
    one = RulesPolicy().decide(snapshot).choices["j"]
    assert one.config is not None
    assert one.config.world_size == 4
    assert "one GPU model holds at most 4" in one.reason
    mixing = RulesPolicy().decide(replace(snapshot, mixes_models=True)).choices["j"]
    assert mixing.config is not None
    assert mixing.config.world_size == 8


def test_eval_replays_on_a_cluster_file_with_and_without_mixing(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(
        json.dumps(
            {
                "nodes": [
                    {
                        "node_id": n.node_id,
                        "gpu_model": n.gpu_model,
                        "gpu_count": n.gpu_count,
                        "cpu_milli": n.cpu_milli,
                        "memory_mib": n.memory_mib,
                    }
                    for n in SPREAD
                ]
            }
        )
    )
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus\n0,1800,1\n60,3600,4\n120,900,12\n")
    args = ["eval", "--philly-jobs", str(trace), "--cluster-file", str(cluster)]
    args += ["--policies", "rules", "--seeds", "1", "--json"]
    for flag, mixes in (("--no-mix-gpu-models", False), ("--mix-gpu-models", True)):
        done = cli(*args, flag)
        assert done.exit_code == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["trace"]["gpus"] == 12
        assert report["trace"]["cluster_file"] == str(cluster)
        assert report["trace"]["mix_models"] is mixes
        assert report["policies"]["rules"]["n_jobs_done"] == 3
