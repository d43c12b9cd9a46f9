"""The Ray cluster as the Planner sees it: one ``NodeInfo`` per alive Ray node, whose
``node_id`` is Ray's node id (what placement-group bundles are pinned to).

A node with GPUs reports them under its accelerator type when the catalog knows it
(``accelerator_type:H200`` -> ``H200``), else as ``A100``-class devices; a CPU-only node
offers one ``CPU`` device per logical CPU, so each rank takes one.
"""

from __future__ import annotations

from typing import Any

from autotune.catalog.devices import CATALOG, node_info
from autotune.core import NodeInfo

__all__ = ["ray_nodes"]


def _gpu_model(resources: dict[str, Any]) -> str:
    for key in resources:
        if key.startswith("accelerator_type:"):
            name = key.split(":", 1)[1]
            if name in CATALOG:
                return name
    return "A100"


def ray_nodes() -> list[NodeInfo]:
    """The alive nodes of the Ray cluster this process is connected to."""
    import ray

    nodes = []
    for entry in ray.nodes():  # type: ignore[no-untyped-call]
        if not entry.get("Alive"):
            continue
        resources = entry.get("Resources", {})
        gpus = int(resources.get("GPU", 0))
        cpus = int(resources.get("CPU", 0))
        memory_mib = int(resources.get("memory", 0) // 2**20)
        if gpus:
            model, count = _gpu_model(resources), gpus
        else:
            model, count = "CPU", max(cpus, 1)
        nodes.append(
            node_info(
                entry["NodeID"],
                gpu_model=model,
                gpu_count=count,
                cpu_milli=cpus * 1000,
                memory_mib=memory_mib,
            )
        )
    return nodes
