"""A policy that picks the GPU type itself (``PolicyChoice.gpu_models``), and a world that
places jobs as Pollux's and Sia's simulators do (``ClusterSnapshot.packs_jobs``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from autotune.catalog.devices import node_info
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobConfig, JobSpec, NodeInfo, Placement, RankSlot
from autotune.decision.step import decide
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice
from autotune.planner import plan, verify_placements


def _node(node_id: str, model: str, gpus: int) -> NodeInfo:
    return node_info(node_id, gpu_model=model, gpu_count=gpus, cpu_milli=64_000, memory_mib=500_000)


NODES = (_node("a0", "A100M40", 8), _node("a1", "A100M40", 8), _node("t0", "T4", 4))


def _spec(job_id: str, gpus: int, gpu_types: tuple[str, ...] | None = None) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        model=MODEL_CATALOG["resnet-50"],
        min_gpus=gpus,
        max_gpus=gpus,
        global_batch=256,
        gpu_types=gpu_types,
    )


def _per_node(placement: Placement) -> list[int]:
    return sorted(Counter(s.node_id for s in placement.ranks).values(), reverse=True)


def test_a_policy_choice_sends_a_waiting_job_to_the_model_it_names() -> None:
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=NODES,
        jobs=(JobStatus(spec=_spec("j", 4), state="pending"),),
        telemetry="test",
    )
    choice = PolicyChoice(config=JobConfig.data_parallel(4), reason="chosen", gpu_models=("T4",))
    round_ = decide(snapshot, {"j": choice}, {}, honoured={}, policy_version="t")
    (decision,) = round_.decisions
    assert decision.placement is not None
    assert {s.node_id for s in decision.placement.ranks} == {"t0"}
    # Without the choice's models the Planner takes the faster A100.
    free = decide(
        snapshot,
        {"j": PolicyChoice(config=JobConfig.data_parallel(4), reason="chosen")},
        {},
        honoured={},
        policy_version="t",
    )
    assert free.decisions[0].placement is not None
    assert {s.node_id[0] for s in free.decisions[0].placement.ranks} == {"a"}


def test_a_policy_cannot_send_a_job_to_a_model_its_spec_forbids() -> None:
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=NODES,
        jobs=(JobStatus(spec=_spec("j", 4, gpu_types=("A100M40",)), state="pending"),),
        telemetry="test",
    )
    choice = PolicyChoice(config=JobConfig.data_parallel(4), reason="chosen", gpu_models=("T4",))
    round_ = decide(snapshot, {"j": choice}, {}, honoured={}, policy_version="t")
    assert round_.decisions == []
    assert (
        "the policy chose GPU models (T4) it may not run on (A100M40): waiting"
        in (round_.unplaced["j"])
    )


def test_no_models_is_refused() -> None:
    with pytest.raises(ValueError, match="allows no GPU model"):
        PolicyChoice(config=None, reason="x", gpu_models=())


def test_packing_fills_the_nodes_with_most_free_gpus_first() -> None:
    """12 GPUs on two 8-GPU nodes: the Planner's equal blocks give 6 + 6; packed, as
    Sia's and Pollux's simulators place jobs, 8 + 4."""
    spec = _spec("j", 12, gpu_types=("A100M40",))
    configs = {"j": JobConfig.data_parallel(12)}
    blocks = plan([spec], NODES, configs)
    packed = plan([spec], NODES, configs, pack=True)
    assert _per_node(blocks.placements["j"]) == [6, 6]
    assert _per_node(packed.placements["j"]) == [8, 4]
    assert verify_placements([spec], NODES, packed.placements) == []


def test_a_packing_world_says_so_in_its_snapshot() -> None:
    spec = _spec("j", 12, gpu_types=("A100M40",))
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=NODES,
        jobs=(JobStatus(spec=spec, state="pending"),),
        telemetry="test",
        packs_jobs=True,
    )
    choice = PolicyChoice(config=JobConfig.data_parallel(12), reason="chosen")
    (decision,) = decide(snapshot, {"j": choice}, {}, honoured={}, policy_version="t").decisions
    assert decision.placement is not None
    assert _per_node(decision.placement) == [8, 4]


def test_a_running_job_the_policy_moves_to_another_model_is_placed_there() -> None:
    a100 = Placement(
        job_id="j",
        ranks=tuple(RankSlot(rank=i, node_id="a0", gpu_index=i) for i in range(4)),
    )
    snapshot = ClusterSnapshot(
        time_s=0.0,
        nodes=NODES,
        jobs=(
            JobStatus(
                spec=_spec("j", 4),
                state="running",
                config=JobConfig.data_parallel(4),
                placement=a100,
            ),
        ),
        telemetry="test",
    )
    choice = PolicyChoice(config=JobConfig.data_parallel(4), reason="moved", gpu_models=("T4",))
    (decision,) = decide(snapshot, {"j": choice}, {}, honoured={}, policy_version="t").decisions
    assert decision.placement is not None
    assert {s.node_id for s in decision.placement.ranks} == {"t0"}
    # Where its spec forbids the model, it keeps what it has.
    forbidden = replace(snapshot.jobs[0], spec=_spec("j", 4, gpu_types=("A100M40",)))
    kept = decide(
        replace(snapshot, jobs=(forbidden,)), {"j": choice}, {}, honoured={}, policy_version="t"
    )
    assert kept.decisions == []
