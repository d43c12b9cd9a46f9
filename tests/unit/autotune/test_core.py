"""Core types: invariants, the -1 rule of layouts, and JSON round-trips."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.core import (
    CompressionSpec,
    Decision,
    JobConfig,
    JobSpec,
    Layout,
    ModelProfile,
    NodeInfo,
    Placement,
    PrecisionMap,
    RankSlot,
    fast_precisions,
)
from autotune.serde import from_json, to_json


def node(**changes: object) -> NodeInfo:
    fields: dict[str, object] = dict(
        node_id="n0",
        gpu_model="A100",
        gpu_count=8,
        gpu_memory_bytes=80 << 30,
        peak_tflops={"fp32": 19.5, "bf16": 312.0},
        intra_node_bandwidth_gbps=300,
        inter_node_bandwidth_gbps=12.5,
        cpu_milli=64000,
        memory_mib=512000,
    )
    fields.update(changes)
    return NodeInfo(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (lambda: node(gpu_count=-1), "gpu_count", "-1"),
        (lambda: node(node_id="a b"), "node_id", "'a b'"),
        (lambda: node(peak_tflops={"fp4": 1.0}), "peak_tflops", "'fp4'"),
        (lambda: node(inter_node_bandwidth_gbps=0), "inter_node_bandwidth_gbps", "0"),
        (lambda: JobSpec(job_id="j", min_gpus=4, max_gpus=2), "max_gpus", "2"),
        (lambda: JobSpec(job_id="j", gpu_milli=1001), "gpu_milli", "1001"),
        (lambda: JobSpec(job_id="j", gpu_milli=500, max_gpus=2), "gpu_milli", "500"),
        (lambda: JobSpec(job_id="j", max_nodes=0), "max_nodes", "0"),
        (lambda: Layout(world_size=8, tp=3), "dp", "-1"),
        (lambda: Layout(world_size=8, dp=2, tp=2, pp=1), "world_size", "8"),
        (lambda: Layout(world_size=8, dp=-1, tp=-1), "tp", "-1"),
        (lambda: Layout(world_size=4, micro_batches=0), "micro_batches", "0"),
        (lambda: PrecisionMap(norm="fp8"), "norm", "'fp8'"),
        (lambda: PrecisionMap(optimizer_state="fp16"), "optimizer_state", "'fp16'"),
        (lambda: PrecisionMap(ffn="int4"), "ffn", "'int4'"),  # type: ignore[arg-type]
        (lambda: CompressionSpec(kind="topk"), "ratio", "None"),
        (lambda: CompressionSpec(kind="topk", ratio=1.5), "ratio", "1.5"),
        (lambda: CompressionSpec(kind="int8", ratio=0.1), "ratio", "0.1"),
        (lambda: CompressionSpec(kind="powersgd", rank=0), "rank", "0"),
        (lambda: CompressionSpec(kind="zip"), "kind", "'zip'"),  # type: ignore[arg-type]
        (lambda: RankSlot(rank=0, node_id="n", gpu_index=0, gpu_milli=0), "gpu_milli", "0"),
        (
            lambda: ModelProfile(
                name="m",
                parameters=0,
                flops_per_sample=1,
                activation_bytes_per_sample=1,
                num_layers=1,
            ),
            "parameters",
            "0",
        ),
    ],
)
def test_invalid_values_name_field_and_value(build, field: str, value: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"\." + field + "=") as info:
        build()
    assert value in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"world_size": 8}, (8, 1, 1)),
        ({"world_size": 8, "tp": 2}, (4, 2, 1)),
        ({"world_size": 16, "dp": 2, "tp": -1, "pp": 2}, (2, 4, 2)),
        ({"world_size": 12, "dp": 3, "tp": 2, "pp": -1}, (3, 2, 2)),
    ],
)
def test_layout_minus_one_takes_the_rest(kwargs: dict[str, int], expected: tuple[int, ...]) -> None:
    layout = Layout(**kwargs)
    assert (layout.dp, layout.tp, layout.pp) == expected


def test_placement_rejects_two_ranks_on_one_gpu_and_gaps() -> None:
    with pytest.raises(ValueError, match="same GPU"):
        Placement(
            job_id="j",
            ranks=(
                RankSlot(rank=0, node_id="n", gpu_index=0),
                RankSlot(rank=1, node_id="n", gpu_index=0),
            ),
        )
    with pytest.raises(ValueError, match=r"0\.\.n-1"):
        Placement(job_id="j", ranks=(RankSlot(rank=1, node_id="n", gpu_index=0),))


def test_decision_checks_placement_against_config() -> None:
    placement = Placement(job_id="j", ranks=(RankSlot(rank=0, node_id="n", gpu_index=0),))
    with pytest.raises(ValueError, match="world_size 2"):
        Decision(
            job_id="j",
            config=JobConfig.data_parallel(2),
            placement=placement,
            source="policy",
            policy_version="v",
            reason="r",
        )
    with pytest.raises(ValueError, match="timezone"):
        Decision(
            job_id="j",
            config=JobConfig.data_parallel(1),
            placement=placement,
            source="policy",
            policy_version="v",
            reason="r",
            decided_at=datetime(2026, 1, 1),
        )
    with pytest.raises(ValueError, match="source"):
        Decision(
            job_id="j",
            config=JobConfig.data_parallel(1),
            placement=placement,
            source="oracle",
            policy_version="v",
            reason="r",
        )  # type: ignore[arg-type]


def test_uniform_precision_keeps_norms_and_optimizer_in_fp32() -> None:
    fp8 = PrecisionMap.uniform("fp8")
    assert (fp8.ffn, fp8.attention_qkv, fp8.embedding, fp8.head) == ("fp8", "fp8", "bf16", "bf16")
    assert (fp8.norm, fp8.optimizer_state) == ("fp32", "fp32")
    assert fp8.lowest() == "fp8"
    assert PrecisionMap().lowest() == "fp32"


def test_a_precision_is_a_fast_path_only_where_it_is_faster() -> None:
    assert fast_precisions({"fp32": 19.5, "bf16": 312, "fp16": 312}) == {"fp32", "bf16", "fp16"}
    assert fast_precisions({"fp32": 67, "bf16": 989, "fp8": 1979}) == {"fp32", "bf16", "fp8"}
    assert fast_precisions({"fp32": 8.1, "fp16": 65}) == {"fp32", "fp16"}
    # A calibrated CPU whose bf16 matmuls measured slower than its fp32 ones.
    assert fast_precisions({"fp32": 0.029, "bf16": 0.019}) == {"fp32"}
    # fp8 no faster than the 16-bit path is no fast path of its own.
    assert fast_precisions({"fp32": 10, "bf16": 100, "fp8": 100}) == {"fp32", "bf16"}


configs = st.builds(
    lambda world, tp_exp, ckpt, precision, kind: JobConfig(
        layout=Layout(world_size=world * 2**tp_exp, tp=2**tp_exp, activation_checkpointing=ckpt),
        precision=PrecisionMap.uniform(precision),
        compression=(
            CompressionSpec(kind="topk", ratio=0.01)
            if kind == "topk"
            else CompressionSpec(kind="powersgd", rank=4)
            if kind == "powersgd"
            else CompressionSpec(kind=kind)
        ),
    ),
    st.integers(1, 16),
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from(["fp32", "bf16", "fp16", "fp8"]),
    st.sampled_from(["none", "topk", "int8", "fp8", "powersgd"]),
)


@given(configs)
def test_job_config_json_round_trip(config: JobConfig) -> None:
    assert from_json(JobConfig, to_json(config)) == config


def test_decision_json_round_trip_and_invalid_json_is_a_value_error() -> None:
    placement = Placement(
        job_id="j", ranks=tuple(RankSlot(rank=r, node_id="n", gpu_index=r) for r in range(2))
    )
    decision = Decision(
        job_id="j",
        config=JobConfig.data_parallel(2),
        placement=placement,
        source="override",
        policy_version="v1",
        reason="pinned",
    )
    assert from_json(Decision, to_json(decision)) == decision
    broken = to_json(decision)
    broken["config"]["layout"]["tp"] = 3
    with pytest.raises(ValueError, match=r"must equal dp\*tp\*pp"):
        from_json(Decision, broken)


def test_by_identity_builds_once_per_kept_tuple_and_always_for_a_list() -> None:
    from autotune.catalog.devices import node_info
    from autotune.core import ByIdentity, node_table

    built: list[int] = []

    def count(nodes: Sequence[NodeInfo]) -> int:
        built.append(len(nodes))
        return len(built)

    memo = ByIdentity(count, size=2)
    a = (node_info("a", gpu_model="A100", gpu_count=8, cpu_milli=1000, memory_mib=1024),)
    b = (node_info("b", gpu_model="T4", gpu_count=4, cpu_milli=1000, memory_mib=1024),)
    c = (node_info("c", gpu_model="T4", gpu_count=2, cpu_milli=1000, memory_mib=1024),)
    assert [memo(a), memo(a), memo(b), memo(a)] == [1, 1, 2, 1]
    assert memo(list(a)) == 3
    assert memo(list(a)) == 4
    memo(c)  # evicts b, the least recently used
    assert memo(b) == 6  # built again
    assert memo(a) == 7  # evicted by b
    table = node_table(
        (*a, *b, node_info("cpu", gpu_model="", gpu_count=0, cpu_milli=1000, memory_mib=1024))
    )
    assert table.total_gpus == 12
    assert table.gpus_by_model == {"A100": 8, "T4": 4}
    assert [n.node_id for n in table.gpu_nodes] == ["a", "b"]
    assert "cpu" in table.by_id


def test_a_profile_carries_measured_compression_efficiencies_by_the_compressions_name() -> None:
    base = ModelProfile(
        name="m", parameters=10, flops_per_sample=1.0, activation_bytes_per_sample=1.0,
        num_layers=1,
    )  # fmt: skip
    assert base.with_compression_efficiency(None) is base
    measured = base.with_compression_efficiency({"topk:0.01": 0.3, "int8": 1.0})
    assert measured.compression_efficiency == (("int8", 1.0), ("topk:0.01", 0.3))
    # A later measurement replaces the one for its compression only.
    again = measured.with_compression_efficiency({"topk:0.010": 0.4})
    assert dict(again.compression_efficiency) == {"int8": 1.0, "topk:0.01": 0.4}
    assert from_json(ModelProfile, to_json(again)) == again
    with pytest.raises(ValueError, match="must be str"):
        ModelProfile(
            name="m", parameters=10, flops_per_sample=1.0, activation_bytes_per_sample=1.0,
            num_layers=1, compression_efficiency=(("topk:0.010", 0.5),),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"\(0, 4.0\]"):
        base.with_compression_efficiency({"int8": 0.0})
    # Above 1 where measured so (a compression that beat dense on every seed), up to 4.
    assert dict(base.with_compression_efficiency({"topk:0.01": 2.2}).compression_efficiency)[
        "topk:0.01"
    ] == pytest.approx(2.2)
    with pytest.raises(ValueError, match=r"\(0, 4.0\]"):
        base.with_compression_efficiency({"topk:0.01": 4.5})
