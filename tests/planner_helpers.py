"""What the Planner's tests share: an independent checker of placements, random clusters
and jobs (hypothesis strategies), small clusters and a running job's placement."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from autotune.catalog.devices import node_info
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import (
    JobConfig,
    JobSpec,
    NodeInfo,
    Placement,
    RankSlot,
)
from autotune.perf.memory import rank_memory

MODELS = ("A100", "T4", "V100M32")


# --------------------------------------------------------------------------------------
# An independent checker of placements
# --------------------------------------------------------------------------------------


def assert_valid(
    jobs: Sequence[JobSpec],
    nodes: Sequence[NodeInfo],
    configs: dict[str, JobConfig],
    placements: dict[str, Placement],
) -> None:
    by_id = {n.node_id: n for n in nodes}
    milli: dict[tuple[str, int], int] = {}
    cpu: dict[str, float] = {}
    mem: dict[str, float] = {}
    for job in jobs:
        placement = placements.get(job.job_id)
        if placement is None:
            continue
        config = configs.get(job.job_id) or JobConfig.data_parallel(job.min_gpus)
        # gang: every rank of the config, each once
        assert sorted(s.rank for s in placement.ranks) == list(range(config.world_size))
        tp = config.layout.tp
        for group in range(config.world_size // tp):
            members = placement.ranks[group * tp : (group + 1) * tp]
            assert len({s.node_id for s in members}) == 1, "a TP group spans nodes"
        if job.max_nodes is not None:
            assert len({s.node_id for s in placement.ranks}) <= job.max_nodes
        for slot in placement.ranks:
            node = by_id[slot.node_id]
            assert slot.gpu_index < node.gpu_count
            assert job.gpu_types is None or node.gpu_model in job.gpu_types
            assert slot.gpu_milli == job.gpu_milli
            if job.model is not None:
                estimate = rank_memory(job.model, config, job.global_batch)
                assert estimate.fits(node.gpu_memory_bytes, job.gpu_milli)
            key = (slot.node_id, slot.gpu_index)
            milli[key] = milli.get(key, 0) + slot.gpu_milli
            cpu[slot.node_id] = cpu.get(slot.node_id, 0) + job.cpu_milli / config.world_size
            mem[slot.node_id] = mem.get(slot.node_id, 0) + job.memory_mib / config.world_size
    assert all(v <= 1000 for v in milli.values()), "a GPU is over-committed"
    assert all(v <= by_id[n].cpu_milli + 1e-6 for n, v in cpu.items()), "CPU over-committed"
    assert all(v <= by_id[n].memory_mib + 1e-6 for n, v in mem.items()), "memory over-committed"


# --------------------------------------------------------------------------------------
# Random instances
# --------------------------------------------------------------------------------------


@st.composite
def nodes_strategy(draw: st.DrawFn, max_nodes: int = 4) -> list[NodeInfo]:
    count = draw(st.integers(1, max_nodes))
    return [
        node_info(
            f"n{i}",
            gpu_model=draw(st.sampled_from(MODELS)),
            gpu_count=draw(st.integers(1, 4)),
            cpu_milli=draw(st.sampled_from([8000, 16000, 32000])),
            memory_mib=draw(st.sampled_from([16384, 65536])),
        )
        for i in range(count)
    ]


@st.composite
def job_strategy(draw: st.DrawFn, index: int) -> JobSpec:
    shared = draw(st.booleans())
    gpus = 1 if shared else draw(st.integers(1, 4))
    types = draw(st.none() | st.sets(st.sampled_from(MODELS), min_size=1).map(tuple))
    model = draw(st.sampled_from([None, "gpt-350m", "gpt-1.3b"]))
    return JobSpec(
        job_id=f"j{index}",
        model=None if model is None else MODEL_CATALOG[model],
        global_batch=8,
        min_gpus=gpus,
        max_gpus=gpus,
        gpu_milli=draw(st.sampled_from([200, 450, 500, 700, 1000])) if shared else 1000,
        gpu_types=types,
        max_nodes=1,
        cpu_milli=draw(st.sampled_from([0, 2000, 6000, 12000])),
        memory_mib=draw(st.sampled_from([0, 8192, 32768])),
        submitted_at=float(index),
    )


@st.composite
def jobs_strategy(draw: st.DrawFn, max_jobs: int = 4) -> list[JobSpec]:
    return [draw(job_strategy(i)) for i in range(draw(st.integers(1, max_jobs)))]


def cluster(*specs: tuple[str, int]) -> list[NodeInfo]:
    return [
        node_info(f"n{i}", gpu_model=model, gpu_count=gpus, cpu_milli=64000, memory_mib=262144)
        for i, (model, gpus) in enumerate(specs)
    ]


def running(job_id: str, node: str, gpus: Sequence[int]) -> Placement:
    return Placement(
        job_id=job_id,
        ranks=tuple(RankSlot(rank=r, node_id=node, gpu_index=g) for r, g in enumerate(gpus)),
    )
