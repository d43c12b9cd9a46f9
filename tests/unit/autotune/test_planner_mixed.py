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
from autotune.core import (
    JobConfig,
    JobSpec,
    Layout,
    NodeInfo,
    Placement,
    PrecisionMap,
    RankSlot,
)
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
    mixed = shape_of(_placement(("h0", 4), ("v0", 4)), nodes, balanced=True)
    assert mixed.gpu_model == "V100M32"  # the slowest, as before
    assert dict(mixed.gpu_models) == {"H100": 4, "V100M32": 4}
    config = JobConfig.data_parallel(8)
    fp32 = config.precision
    fast, slow = rank_speed("H100", RESNET, fp32), rank_speed("V100M32", RESNET, fp32)
    assert fast > 2 * slow
    gain = balance_gain(mixed, RESNET, config)
    assert gain == pytest.approx((4 * fast + 4 * slow) / (8 * slow))
    even = step_time(RESNET, config, replace(mixed, balanced=False), 512)  # slowest pace
    assert even.compute_s == step_time(RESNET, config, replace(mixed, gpu_models=()), 512).compute_s
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
    """Another job holds half of each H100 node: 8 GPUs of one model are not free, and
    deepspeech2's 8 ranks run faster on 4 H100 and 4 V100 than on the 4 free H100."""
    busy = JobSpec(job_id="busy", min_gpus=4, max_gpus=4)
    held = Placement(
        job_id="busy",
        ranks=tuple(
            RankSlot(rank=i, node_id=n, gpu_index=g)
            for i, (n, g) in enumerate((("h0", 2), ("h0", 3), ("h1", 2), ("h1", 3)))
        ),
    )
    spec = JobSpec(
        job_id="j", model=MODEL_CATALOG["deepspeech2"], min_gpus=1, max_gpus=8, global_batch=768
    )
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=tuple(SPREAD),
        jobs=(
            JobStatus(
                spec=busy, state="running", config=JobConfig.data_parallel(4), placement=held
            ),
            JobStatus(spec=spec, state="pending"),
        ),
        telemetry="test",
        mixes_models=True,
    )
    choices = {"j": PolicyChoice(config=JobConfig.data_parallel(8), reason="chosen")}
    round_ = decide(snapshot, choices, {}, honoured={}, policy_version="t")
    (decision,) = round_.decisions
    assert decision.placement is not None
    assert len(decision.placement.ranks) == 8
    assert "on several GPU models (4xH100 + 4xV100M32)" in decision.reason
    assert "against" in decision.reason
    assert "on the 4 free H100 alone" in decision.reason
    assert "on several GPU models" in round_.why["j"].explanation["why"]
    # A backend that cannot balance shares never gets a mixed placement: the job waits
    # for 8 GPUs of one model.
    flat = decide(
        replace(snapshot, mixes_models=False), choices, {}, honoured={}, policy_version="t"
    )
    assert flat.decisions == []
    assert "waiting for 8 GPU(s) of one model" in flat.unplaced["j"]


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


def test_the_balanced_pace_is_the_summed_speed_whichever_model_is_slowest_in_fp32() -> None:
    """An A100 is slower than an A10 in fp32 but faster in bf16: compute is the step's
    FLOPs over the ranks' summed bf16 speeds, whichever device the shape is priced on."""
    nodes = {"a": _node("a", "A100"), "g": _node("g", "A10")}
    shape = shape_of(_placement(("a", 4), ("g", 4)), nodes, balanced=True)
    bf16 = replace(JobConfig.data_parallel(8), precision=PrecisionMap.uniform("bf16"))
    speeds = {m: rank_speed(m, RESNET, bf16.precision) for m in ("A100", "A10")}
    assert speeds["A100"] > speeds["A10"]
    overhead = DEFAULT_COEFFICIENTS.compute_overhead_s
    got = step_time(RESNET, bf16, shape, 512).compute_s - overhead
    one = step_time(RESNET, bf16, replace(shape, gpu_models=()), 512).compute_s - overhead
    # ``one``: every rank on ``shape.gpu_model``'s device, at that device's speed.
    on_device = speeds[shape.gpu_model]
    assert got == pytest.approx(one * 8 * on_device / (4 * speeds["A100"] + 4 * speeds["A10"]))
    # Even shares: every rank at the A10's bf16 pace, the slowest in this precision.
    even = step_time(RESNET, bf16, replace(shape, balanced=False), 512).compute_s - overhead
    assert even == pytest.approx(one * on_device / speeds["A10"])
    with pytest.raises(ValueError, match="ranks expected"):
        replace(shape, gpu_models=(("A100", 4), ("A10", 5)))


def test_a_job_no_single_model_can_hold_at_its_minimum_mixes_rather_than_wait() -> None:
    """12 ranks at least, on 8 H100 (one node) and 4 V100: the H100 alone would run
    faster, but the job may not have 8; mixing beats waiting for ever."""
    spec = JobSpec(job_id="j", model=RESNET, min_gpus=12, max_gpus=12, global_batch=768)
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=tuple(TOGETHER),
        jobs=(JobStatus(spec=spec, state="pending"),),
        telemetry="test",
        mixes_models=True,
    )
    choices = {"j": PolicyChoice(config=JobConfig.data_parallel(12), reason="twelve")}
    (decision,) = decide(snapshot, choices, {}, honoured={}, policy_version="t").decisions
    assert decision.placement is not None
    assert len(decision.placement.ranks) == 12
    assert "against no size it may have on one model" in decision.reason


def test_a_running_mixed_job_keeps_its_gpus_and_its_configuration() -> None:
    """Re-given its own configuration, a job running across models is neither declined
    for want of 12 GPUs of one model nor moved."""
    spec, configs = _job()
    placement = plan([spec], SPREAD, configs, mix_models=True).placements["j"]
    running = JobStatus(spec=spec, state="running", config=configs["j"], placement=placement)
    snapshot = ClusterSnapshot(
        time_s=0.0, nodes=tuple(SPREAD), jobs=(running,), telemetry="test", mixes_models=True
    )
    choices = {"j": PolicyChoice(config=configs["j"], reason="the same")}
    round_ = decide(snapshot, choices, {}, honoured={}, policy_version="t")
    assert round_.declined == {}
    assert round_.decisions == []  # kept where it runs: nothing to decide


def test_a_mixed_jobs_shrink_is_priced_on_its_slowest_model() -> None:
    """A resize of a job across models is priced on its slowest model (where its new
    ranks would go is unknown), never with the old per-model counts."""
    from autotune.decision.payoff import _resized

    nodes = {n.node_id: n for n in SPREAD}
    shape = shape_of(_placement(("h0", 4), ("h1", 4), ("v0", 4)), nodes, balanced=True)
    smaller = _resized(shape, 4)
    assert smaller.world_size == 4
    assert not smaller.mixed
    assert smaller.gpu_model == "V100M32"


def test_a_job_the_rounds_cannot_place_for_cpu_mixes_within_every_nodes_limits() -> None:
    """8 H100 are free, but each node's cores host 3 of the job's ranks: the rounds and
    the packing fallback fail on one model, and the mix keeps to 3 ranks per node."""
    spec = JobSpec(
        job_id="j",
        model=MODEL_CATALOG["deepspeech2"],
        min_gpus=1,
        max_gpus=8,
        global_batch=768,
        cpu_milli=160_000,  # 20 cores a rank; a node has 64
    )
    result = plan([spec], SPREAD, {"j": JobConfig.data_parallel(8)}, mix_models=True)
    placed = result.placements["j"]
    assert verify_placements([spec], SPREAD, result.placements) == []
    per_node = {n: sum(1 for s in placed.ranks if s.node_id == n) for n in ("h0", "h1", "v0")}
    assert per_node == {"h0": 3, "h1": 3, "v0": 2}  # the fastest model's nodes first
    assert "on several GPU models (6xH100 + 2xV100M32)" in result.mixed["j"]
    assert "on the 6 free H100 alone" in result.mixed["j"]


# --- a split chosen by the policy (``PolicyChoice.gpu_split``, ``plan(splits=...)``) ---


def test_a_split_is_placed_as_asked_most_free_nodes_first() -> None:
    spec, configs = _job(world=6)
    result = plan([spec], SPREAD, configs, splits={"j": {"H100": 2, "V100M32": 4}})
    placed = result.placements["j"]
    assert verify_placements([spec], SPREAD, result.placements) == []
    assert dict(shape_of(placed, {n.node_id: n for n in SPREAD}).gpu_models) == {
        "H100": 2,
        "V100M32": 4,
    }
    assert {slot.node_id for slot in placed.ranks} == {"h0", "v0"}  # two H100 on one node
    assert result.mixed["j"] == "across GPU models as chosen: 2xH100 + 4xV100M32"


def test_a_split_without_room_or_of_another_size_waits_with_the_reason() -> None:
    spec, configs = _job(world=6)
    short = plan([spec], SPREAD, configs, splits={"j": {"H100": 1, "V100M32": 5}})
    assert short.placements == {}
    assert (
        short.unplaced["j"] == "split across GPU models 1xH100 + 5xV100M32: 4 V100M32 free for it"
    )
    wrong = plan([spec], SPREAD, configs, splits={"j": {"H100": 2, "V100M32": 2}})
    assert "is not the job's 6 ranks" in wrong.unplaced["j"]
    barred = replace(spec, gpu_types=("H100",))
    refused = plan([barred], SPREAD, configs, splits={"j": {"H100": 2, "V100M32": 4}})
    assert "it may not run on V100M32" in refused.unplaced["j"]


def test_a_running_job_keeps_its_placement_only_where_it_holds_the_split() -> None:
    spec, configs = _job(world=6)
    held = _placement(("h0", 2), ("v0", 4))
    same = plan([spec], SPREAD, configs, {"j": held}, splits={"j": {"H100": 2, "V100M32": 4}})
    assert same.placements["j"] == held
    assert "j" in same.kept
    moved = plan([spec], SPREAD, configs, {"j": held}, splits={"j": {"H100": 4, "V100M32": 2}})
    assert "j" not in moved.kept
    assert dict(shape_of(moved.placements["j"], {n.node_id: n for n in SPREAD}).gpu_models) == {
        "H100": 4,
        "V100M32": 2,
    }


def test_a_policys_split_is_checked_and_honoured_only_where_the_backend_mixes() -> None:
    config = JobConfig.data_parallel(6)
    with pytest.raises(ValueError, match="does not add up"):
        PolicyChoice(config=config, reason="r", gpu_split=(("H100", 2), ("V100M32", 2)))
    with pytest.raises(ValueError, match="two GPU models or more"):
        PolicyChoice(config=config, reason="r", gpu_split=(("H100", 6),))
    with pytest.raises(ValueError, match="not the gpu_split's"):
        PolicyChoice(
            config=config, reason="r", gpu_split=(("H100", 2), ("V100M32", 4)), gpu_models=("H100",)
        )
    snapshot = _waiting(_job(world=6)[0])
    choice = PolicyChoice(
        config=config,
        reason="chosen",
        gpu_models=("H100", "V100M32"),
        gpu_split=(("H100", 2), ("V100M32", 4)),
    )
    (decision,) = decide(snapshot, {"j": choice}, {}, honoured={}, policy_version="t").decisions
    assert decision.placement is not None
    assert dict(shape_of(decision.placement, {n.node_id: n for n in SPREAD}).gpu_models) == {
        "H100": 2,
        "V100M32": 4,
    }
    assert decision.reason.startswith("chosen; across GPU models as chosen: 2xH100 + 4xV100M32")
    flat = decide(
        replace(snapshot, mixes_models=False), {"j": choice}, {}, honoured={}, policy_version="t"
    )
    (one,) = flat.decisions
    assert one.placement is not None
    assert not shape_of(one.placement, {n.node_id: n for n in SPREAD}).mixed
    assert "not split across GPU models: this backend runs a job on one model" in one.reason


def _waiting(spec: JobSpec) -> ClusterSnapshot:
    """``spec`` waiting on ``SPREAD``, on a backend that mixes models."""
    return ClusterSnapshot(
        time_s=0.0,
        nodes=tuple(SPREAD),
        jobs=(JobStatus(spec=spec, state="pending"),),
        telemetry="test",
        mixes_models=True,
    )


def _running_split() -> ClusterSnapshot:
    spec, configs = _job(world=6)
    held = _placement(("h0", 2), ("v0", 4))
    running = JobStatus(spec=spec, state="running", config=configs["j"], placement=held)
    return ClusterSnapshot(
        time_s=0.0, nodes=tuple(SPREAD), jobs=(running,), telemetry="test", mixes_models=True
    )


def test_a_running_jobs_new_split_short_of_one_model_is_declined() -> None:
    """Holding 2 H100 and all 4 V100, a split asking 5 V100 finds 4 for it: declined, and
    the job keeps its placement; one asking 4 H100 and 2 V100 is placed so."""
    snapshot = _running_split()
    short = PolicyChoice(
        config=JobConfig.data_parallel(7), reason="more", gpu_split=(("H100", 2), ("V100M32", 5))
    )
    round_ = decide(snapshot, {"j": short}, {}, honoured={}, policy_version="t")
    assert round_.decisions == []
    assert round_.declined["j"].endswith("needs 5 V100M32 (4 free for it)")
    moved = PolicyChoice(
        config=JobConfig.data_parallel(6), reason="moved", gpu_split=(("H100", 4), ("V100M32", 2))
    )
    (decision,) = decide(snapshot, {"j": moved}, {}, honoured={}, policy_version="t").decisions
    assert decision.placement is not None
    assert dict(shape_of(decision.placement, {n.node_id: n for n in SPREAD}).gpu_models) == {
        "H100": 4,
        "V100M32": 2,
    }


def test_a_split_over_models_the_job_may_not_use_is_dropped_with_the_reason() -> None:
    snapshot = _waiting(replace(_job(world=6)[0], gpu_types=("H100",)))
    choice = PolicyChoice(
        config=JobConfig.data_parallel(6), reason="chosen", gpu_split=(("H100", 2), ("V100M32", 4))
    )
    (decision,) = decide(snapshot, {"j": choice}, {}, honoured={}, policy_version="t").decisions
    assert "not split across GPU models: it may run on H100 only" in decision.reason
    assert decision.placement is not None
    assert {slot.node_id for slot in decision.placement.ranks} <= {"h0", "h1"}
