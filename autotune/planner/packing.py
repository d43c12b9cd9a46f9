"""The packing fallback (step 6): a job that no equal blocks could place takes the free
GPUs as they are, on one GPU model."""

from __future__ import annotations

import math

import numpy as np

from autotune.core import MILLI_PER_GPU, Placement, RankSlot
from autotune.planner.capacity import FreeCapacity
from autotune.planner.jobs import PreparedJob, spans_nodes


def pack_greedy(job: PreparedJob, state: FreeCapacity) -> Placement | None:
    """Whole-GPU ranks without tensor parallelism on nodes of one allowed model, the
    nodes with the most free GPUs first (ties: the first node), as many ranks on each as
    it has room for (GPUs, and each rank's share of the job's CPU and memory), within
    ``max_nodes``. ``None`` when no model has room for every rank."""
    spec, world = job.spec, job.world
    if spec.gpu_milli < MILLI_PER_GPU or not spans_nodes(job) or job.config.layout.tp > 1:
        return None
    cpu = math.ceil(spec.cpu_milli / world)
    mem = math.ceil(spec.memory_mib / world)
    free_gpus = (state.free_milli >= MILLI_PER_GPU).sum(axis=1)
    room = free_gpus.copy()
    if cpu:
        room = np.minimum(room, state.free_cpu // cpu)
    if mem:
        room = np.minimum(room, state.free_mem // mem)
    for model in np.flatnonzero(job.allowed):
        nodes = np.flatnonzero(state.gpu_nodes & (state.model_safe == model) & (room > 0))
        order = sorted(nodes.tolist(), key=lambda n: (-int(room[n]), n))
        if spec.max_nodes is not None:
            order = order[: spec.max_nodes]
        if sum(int(room[n]) for n in order) < world:
            continue
        slots: list[RankSlot] = []
        for node in order:
            take = min(int(room[node]), world - len(slots))
            if take == 0:
                break
            gpus = [int(g) for g in np.flatnonzero(state.free_milli[node] >= MILLI_PER_GPU)[:take]]
            state.take(node, gpus, MILLI_PER_GPU, cpu * take, mem * take)
            first = len(slots)
            slots.extend(
                RankSlot(
                    rank=first + i,
                    node_id=state.nodes[node].node_id,
                    gpu_index=gpu,
                    gpu_milli=MILLI_PER_GPU,
                )
                for i, gpu in enumerate(gpus)
            )
        return Placement(job_id=spec.job_id, ranks=tuple(slots))
    return None
