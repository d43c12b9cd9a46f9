"""A check of placements against the cluster's limits and the jobs' constraints,
independent of how they were made."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.core import JobSpec, NodeInfo, Placement


def verify_placements(
    jobs: Sequence[JobSpec], nodes: Sequence[NodeInfo], placements: Mapping[str, Placement]
) -> list[str]:
    """Every way ``placements`` break the cluster's limits or the jobs' constraints:
    GPU milli, CPU or memory over-committed, a disallowed GPU model, a job spread over
    more nodes than it allows, or a gang with missing ranks. Empty when valid."""
    by_id = {n.node_id: n for n in nodes}
    specs = {j.job_id: j for j in jobs}
    gpu_use: dict[tuple[str, int], int] = {}
    cpu_use: dict[str, float] = {}
    mem_use: dict[str, float] = {}
    problems: list[str] = []
    for job_id, placement in placements.items():
        spec = specs.get(job_id)
        if spec is None:
            problems.append(f"{job_id}: placed but not among the jobs")
            continue
        world = placement.world_size
        if not spec.min_gpus <= world <= spec.max_gpus:
            problems.append(f"{job_id}: {world} ranks, allowed {spec.min_gpus}-{spec.max_gpus}")
        if spec.max_nodes is not None and len(placement.nodes) > spec.max_nodes:
            problems.append(f"{job_id}: on {len(placement.nodes)} nodes, max {spec.max_nodes}")
        for slot in placement.ranks:
            node = by_id.get(slot.node_id)
            if node is None or slot.gpu_index >= node.gpu_count:
                problems.append(f"{job_id}: rank {slot.rank} on a GPU that does not exist")
                continue
            if not spec.allows(node.gpu_model):
                problems.append(f"{job_id}: rank {slot.rank} on {node.gpu_model}")
            key = (slot.node_id, slot.gpu_index)
            gpu_use[key] = gpu_use.get(key, 0) + slot.gpu_milli
            cpu_use[slot.node_id] = cpu_use.get(slot.node_id, 0) + spec.cpu_milli / world
            mem_use[slot.node_id] = mem_use.get(slot.node_id, 0) + spec.memory_mib / world
    problems += [f"GPU {k[0]}:{k[1]} holds {v} milli" for k, v in gpu_use.items() if v > 1000]
    for node_id, used in cpu_use.items():
        if used > by_id[node_id].cpu_milli + 1e-6 * max(1, len(placements)):
            problems.append(f"node {node_id}: {used:.0f} CPU milli of {by_id[node_id].cpu_milli}")
    for node_id, used in mem_use.items():
        if used > by_id[node_id].memory_mib + 1e-6 * max(1, len(placements)):
            problems.append(f"node {node_id}: {used:.0f} MiB of {by_id[node_id].memory_mib}")
    return problems
