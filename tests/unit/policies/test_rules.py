"""The rule-based policy under a long queue: a fair share too small for a model is
raised to the fewest GPUs on which it fits, so the queue cannot starve."""

from __future__ import annotations

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
