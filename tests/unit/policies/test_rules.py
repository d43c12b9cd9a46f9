"""The rule-based policy under a long queue: a fair share too small for a model is
raised to the fewest GPUs on which it fits, so the queue cannot starve."""

from __future__ import annotations

from dataclasses import replace

from autotune.catalog.devices import node_info
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobSpec
from autotune.interfaces import ClusterSnapshot, JobStatus
from autotune.perf.memory import rank_memory
from autotune.policies.rules import RulesPolicy


def test_a_long_queue_does_not_shrink_a_big_model_below_what_fits() -> None:
    nodes = [
        node_info(f"a100-{i}", gpu_model="A100", gpu_count=8, cpu_milli=96_000, memory_mib=1 << 20)
        for i in range(4)
    ]
    model = MODEL_CATALOG["gpt-13b"]
    jobs = [
        JobStatus(
            spec=JobSpec(job_id=f"j{i}", model=model, global_batch=32, min_gpus=1, max_gpus=16),
            state="pending",
        )
        for i in range(20)
    ]
    snapshot = ClusterSnapshot(time_s=0.0, nodes=nodes, jobs=jobs, telemetry="simulator")
    choices = RulesPolicy().decide(snapshot).choices
    assert set(choices) == {j.spec.job_id for j in jobs}
    memory = nodes[0].gpu_memory_bytes
    for choice in choices.values():
        config = choice.config
        assert config.world_size > 1  # the fair share, 32 // 20, is one GPU
        assert rank_memory(model, config, 32).fits(memory), choice.reason
        assert "raised to" in choice.reason


def test_a_job_held_to_one_node_is_never_given_more_gpus_than_a_node_has() -> None:
    """With 32 free GPUs on 8-GPU nodes, a lone job allowed 16 GPUs on one node gets 8: 16
    would wait for ever (the Planner runs a job's ranks on at most max_nodes nodes), and a
    replay with such a job played rounds until its step limit."""
    from autotune.decision.step import decide

    nodes = [
        node_info(f"a100-{i}", gpu_model="A100", gpu_count=8, cpu_milli=96_000, memory_mib=1 << 20)
        for i in range(4)
    ]
    spec = JobSpec(
        job_id="lone",
        model=MODEL_CATALOG["gpt-350m"],
        global_batch=32,
        min_gpus=1,
        max_gpus=16,
        max_nodes=1,
    )
    snapshot = ClusterSnapshot(
        time_s=0.0, nodes=nodes, jobs=[JobStatus(spec=spec, state="pending")], telemetry="sim"
    )
    choice = RulesPolicy().decide(snapshot).choices["lone"]
    assert choice.config is not None
    assert choice.config.world_size == 8, choice.reason
    assert "one GPU model holds at most 8" in choice.reason
    round_ = decide(snapshot, {"lone": choice}, {}, honoured={}, policy_version="t")
    assert [d.job_id for d in round_.decisions] == ["lone"]
    assert not round_.unplaced
    # Without the one-node limit, the share of 16 stands (on two nodes).
    spread = replace(spec, max_nodes=None)
    free = replace(snapshot, jobs=[JobStatus(spec=spread, state="pending")])
    assert RulesPolicy().decide(free).choices["lone"].config.world_size == 16


def test_rules_train_in_fp32_where_16_bit_is_no_faster() -> None:
    """A CPU (the catalog's, and one calibrated to bf16 slower than its fp32) gets fp32,
    an A100 bf16."""
    from autotune.core import NodeInfo

    def chosen(nodes: list[NodeInfo]) -> str:
        spec = JobSpec(
            job_id="j", model=MODEL_CATALOG["gpt-125m"], global_batch=16, min_gpus=2, max_gpus=2
        )
        snapshot = ClusterSnapshot(
            time_s=0.0, nodes=nodes, jobs=[JobStatus(spec=spec, state="pending")], telemetry="t"
        )
        choice = RulesPolicy().decide(snapshot).choices["j"]
        assert choice.config is not None
        return choice.config.precision.lowest()

    def nodes(model: str, **changes: object) -> list[NodeInfo]:
        return [
            replace(
                node_info(f"n{i}", gpu_model=model, gpu_count=1, cpu_milli=800, memory_mib=1 << 16),
                **changes,  # type: ignore[arg-type]
            )
            for i in range(2)
        ]

    assert chosen(nodes("A100")) == "bf16"
    assert chosen(nodes("CPU")) == "fp32"
    assert chosen(nodes("CPU", peak_tflops={"fp32": 0.029, "bf16": 0.019})) == "fp32"
