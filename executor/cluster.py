"""The Ray cluster as the Planner sees it: one ``NodeInfo`` per alive Ray node.

A node is named for people: its hostname (or IP address when Ray knows no hostname), with
the first six hex digits of Ray's node id after it when several Ray nodes share the host
(``gpu-box-3``, ``gpu-box-3-a1b2c3``). A name, once given to a Ray node, stays that node's
for the life of the process, so placements keep meaning the same GPUs as nodes come and
go. Ray's own node id (what placement-group bundles are pinned to) is the node's
``backend_node_id``; ``ray_node_id`` and ``node_name`` translate between the two.

A node that Ray declares dead is *lost* (``ray_cluster`` reports it beside the alive ones)
and its name is free again: a Ray node that later starts on the same host (a restarted
raylet gets a new Ray node id) takes the name back, and the node is no longer lost.

A node with GPUs reports them under its accelerator type when the catalog knows it
(``accelerator_type:H200`` -> ``H200``), else as ``A100``-class devices; a CPU-only node
offers one ``CPU`` device per logical CPU, so each rank takes one.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.catalog.devices import CATALOG, node_info
from autotune.core import NodeInfo

__all__ = ["RayCluster", "node_name", "node_names", "ray_cluster", "ray_node_id", "ray_nodes"]

_SUFFIX_DIGITS = 6
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]+")

# Names given so far in this process: Ray node id -> name (alive nodes, and lost ones
# until another node takes the name).
_named: dict[str, str] = {}
# The last NodeInfo of every node seen alive: Ray node id -> info.
_seen: dict[str, NodeInfo] = {}
_lock = threading.Lock()


def _gpu_model(resources: dict[str, Any]) -> str:
    for key in resources:
        if key.startswith("accelerator_type:"):
            name = key.split(":", 1)[1]
            if name in CATALOG:
                return name
    return "A100"


def _host(entry: Mapping[str, Any]) -> str:
    host = str(entry.get("NodeManagerHostname") or entry.get("NodeManagerAddress") or "node")
    host = _UNSAFE.sub("-", host).strip("-._:") or "node"
    if not host[0].isalnum():
        host = f"node-{host}"
    return host[: 128 - _SUFFIX_DIGITS - 1]


def node_names(
    entries: Iterable[Mapping[str, Any]], given: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Readable names for Ray nodes (``ray.nodes()`` entries): Ray node id -> name. Names
    in ``given`` (Ray node id -> name) are kept; the rest are the host, with a short
    suffix of the node id where several nodes share the host or the name is taken."""
    given = dict(given or {})
    entries = sorted(entries, key=lambda e: str(e["NodeID"]))
    hosts = Counter(_host(e) for e in entries)
    taken = set(given.values())
    names: dict[str, str] = {}
    for entry in entries:
        ray_id = str(entry["NodeID"])
        if ray_id in given:
            names[ray_id] = given[ray_id]
            continue
        host = _host(entry)
        name = host if hosts[host] == 1 else f"{host}-{ray_id[:_SUFFIX_DIGITS]}"
        digits = _SUFFIX_DIGITS
        while name in taken:  # a name given earlier to another node on this host
            digits += 2
            name = f"{host}-{ray_id[:digits]}"
        taken.add(name)
        names[ray_id] = name
    return names


@dataclass(frozen=True, slots=True)
class RayCluster:
    alive: list[NodeInfo]
    """The nodes Ray reports alive, by name."""
    lost: list[NodeInfo]
    """Nodes seen alive earlier in this process that Ray now reports dead (as they were
    last seen), unless a node alive now has taken the name back."""


def _info(name: str, entry: Mapping[str, Any]) -> NodeInfo:
    resources = entry.get("Resources", {})
    gpus = int(resources.get("GPU", 0))
    cpus = int(resources.get("CPU", 0))
    memory_mib = int(resources.get("memory", 0) // 2**20)
    if gpus:
        model, count = _gpu_model(resources), gpus
    else:
        model, count = "CPU", max(cpus, 1)
    return node_info(
        name,
        gpu_model=model,
        gpu_count=count,
        cpu_milli=cpus * 1000,
        memory_mib=memory_mib,
        backend_node_id=str(entry["NodeID"]),
    )


def ray_cluster() -> RayCluster:
    """The Ray cluster this process is connected to: its alive nodes and the lost ones."""
    import ray

    entries = ray.nodes()  # type: ignore[no-untyped-call]
    alive = [e for e in entries if e.get("Alive")]
    alive_ids = {str(e["NodeID"]) for e in alive}
    with _lock:
        # A dead node's name is free: only the alive nodes' names are kept as given.
        given = {ray_id: name for ray_id, name in _named.items() if ray_id in alive_ids}
        names = node_names(alive, given)
        taken = set(names.values())
        for ray_id in [r for r, name in _named.items() if r not in alive_ids and name in taken]:
            del _named[ray_id]  # its name went to a node alive now: no longer lost
            _seen.pop(ray_id, None)
        _named.update(names)
        nodes = [_info(names[str(e["NodeID"])], e) for e in alive]
        _seen.update({n.backend_node_id: n for n in nodes})
        lost = [info for ray_id, info in _seen.items() if ray_id not in alive_ids]
    return RayCluster(
        alive=sorted(nodes, key=lambda n: n.node_id),
        lost=sorted(lost, key=lambda n: n.node_id),
    )


def ray_nodes() -> list[NodeInfo]:
    """The alive nodes of the Ray cluster this process is connected to, by name."""
    return ray_cluster().alive


def ray_node_id(name: str) -> str:
    """Ray's node id of the node named ``name`` (a Ray node id is returned as it is)."""
    with _lock:
        for ray_id, given in _named.items():
            if given == name:
                return ray_id
        if name in _named:
            return name
    ray_nodes()  # a node that joined since the names were last read
    with _lock:
        for ray_id, given in _named.items():
            if given == name:
                return ray_id
    return name


def node_name(ray_id: str) -> str:
    """The name of the Ray node ``ray_id`` (the id itself if Ray does not know it)."""
    with _lock:
        if ray_id in _named:
            return _named[ray_id]
    ray_nodes()
    with _lock:
        return _named.get(ray_id, ray_id)
