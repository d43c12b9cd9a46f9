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

A node with GPUs reports them under the catalog's name for them
(``autotune.catalog.devices``), decided once per Ray node, in this order:

1. Ray's accelerator type when it is the catalog's name of one part
   (``accelerator_type:T4`` -> ``T4``). Ray takes an NVIDIA GPU's model word from its
   name, so an H100 PCIe is an ``H100`` to Ray: ``H100``, ``H200`` and ``A100`` nodes
   (``autotune.catalog.detect.SHARED_NAMES``) are recognised as below;
2. else the node's GPU as it describes itself: a task pinned to the node (reserving
   nothing, so busy GPUs do not hold it up) reads GPU 0's properties through NVML, else
   ``torch.cuda``, and ``autotune.catalog.detect.detected_device`` makes an entry of them
   (a known part's datasheet figures with the memory the device reports, or an estimate
   from its SMs, clock and compute capability), registered so ``device`` answers it;
3. else, when the properties cannot be read within ``PROBE_TIMEOUT_S``, the table of
   known parts by Ray's accelerator type (``L4``, ``A10G``, ``GeForce-RTX-4090``);
4. else an entry named for Ray's accelerator type, estimated as a T4-class GPU, with a
   warning. No GPU is taken for an A100 it is not.

A CPU-only node offers one ``CPU`` device per logical CPU, so each rank takes one.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from autotune.catalog.detect import (
    SHARED_NAMES,
    GpuProperties,
    assumed_device,
    detected_device,
    known_part,
    nvml_properties,
    torch_properties,
)
from autotune.catalog.devices import CATALOG, DeviceSpec, device, node_info, register_device
from autotune.core import NodeInfo

__all__ = [
    "PROBE_TIMEOUT_S",
    "RayCluster",
    "node_name",
    "node_names",
    "ray_cluster",
    "ray_node_id",
    "ray_nodes",
]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S: Final = 30.0
"""How long reading a new node's GPU properties may take (a worker process starting)."""
_SUFFIX_DIGITS = 6
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]+")

# Names given so far in this process: Ray node id -> name (alive nodes, and lost ones
# until another node takes the name).
_named: dict[str, str] = {}
# The last NodeInfo of every node seen alive: Ray node id -> info.
_seen: dict[str, NodeInfo] = {}
# The catalog name of each GPU node's devices, once decided: Ray node id -> name.
_models: dict[str, str] = {}
_lock = threading.Lock()


def _read_properties() -> dict[str, Any] | None:
    """GPU 0 of the node this runs on (a Ray task), as a dict; ``None``: none readable."""
    found = nvml_properties() or torch_properties()
    return None if found is None else asdict(found)


def _node_properties(ray_ids: list[str]) -> dict[str, GpuProperties | None]:
    """The GPU properties of the Ray nodes ``ray_ids``, each read on its node, all at
    once; ``None`` for a node whose properties cannot be read within
    ``PROBE_TIMEOUT_S``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_read_properties)
    refs: dict[str, Any] = {}
    out: dict[str, GpuProperties | None] = dict.fromkeys(ray_ids)
    for ray_id in ray_ids:
        try:
            strategy = NodeAffinitySchedulingStrategy(node_id=ray_id, soft=False)
            refs[ray_id] = task.options(scheduling_strategy=strategy).remote()
        except Exception as exc:  # a node id Ray refuses
            log.warning("node %s: its GPU properties cannot be read: %s", ray_id, exc)
    ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)[0])
    for ray_id, ref in refs.items():
        try:
            if ref not in ready:
                raise TimeoutError(f"not read within {PROBE_TIMEOUT_S:.0f} s")
            found = ray.get(ref)
        except Exception as exc:  # a timeout, a task that failed
            log.warning("node %s: its GPU properties could not be read: %s", ray_id, exc)
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
            continue
        out[ray_id] = None if found is None else GpuProperties(**found)
    return out


def _gpu_models(entries: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The catalog name of the GPUs of each GPU node among ``entries`` (``ray.nodes()``
    entries): Ray node id -> name (see the module docstring), decided once per node. The
    properties of new nodes that need them are read here, all at once: call it without
    holding ``_lock``."""
    out: dict[str, str] = {}
    unknown: dict[str, str] = {}  # Ray node id -> Ray's accelerator type
    with _lock:
        for entry in entries:
            resources = entry.get("Resources", {})
            ray_id = str(entry["NodeID"])
            if not int(resources.get("GPU", 0)):
                continue
            if ray_id in _models:
                out[ray_id] = _models[ray_id]
                continue
            types = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
            known = next((t for t in types if t in CATALOG and t not in SHARED_NAMES), None)
            if known is None:
                unknown[ray_id] = types[0] if types else ""
            else:
                out[ray_id] = known
    found = _node_properties(list(unknown)) if unknown else {}
    for ray_id, accelerator in unknown.items():
        out[ray_id] = _recognise(ray_id, accelerator, found.get(ray_id)).name
    with _lock:
        _models.update(out)
    return out


def _recognise(ray_id: str, accelerator: str, props: GpuProperties | None) -> DeviceSpec:
    """The entry for the GPUs of a node the catalog does not name (Ray calls them
    ``accelerator``; ``props``: their properties, if read), registered unless it is a
    catalog entry."""
    if props is not None:
        spec = detected_device(props)
        how = f"recognised from its properties ({props.name})"
    elif (part := known_part(accelerator)) is not None:
        spec = device(part.name)  # one recognised on another node, else the table's
        how = f"from the table of known parts by Ray's accelerator type {accelerator!r}"
    else:
        spec = assumed_device(accelerator or "GPU")
        how = f"Ray's accelerator type {accelerator!r} unknown and its properties unread"
    if spec.name not in CATALOG:
        register_device(spec)
    guessed = spec.source.startswith(("estimated", "assumed"))
    level = logging.WARNING if guessed else logging.INFO
    log.log(level, "node %s: GPU %s (%s): %s", ray_id, spec.name, how, spec.source)
    return spec


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


def _info(name: str, entry: Mapping[str, Any], gpu_model: str | None = None) -> NodeInfo:
    """The node ``entry`` (of ``ray.nodes()``) as the Planner sees it, named ``name``; its
    GPUs are ``gpu_model`` (``None``: decided by ``_gpu_models``, so not under ``_lock``)."""
    resources = entry.get("Resources", {})
    gpus = int(resources.get("GPU", 0))
    cpus = int(resources.get("CPU", 0))
    memory_mib = int(resources.get("memory", 0) // 2**20)
    if gpus:
        model, count = gpu_model or _gpu_models([entry])[str(entry["NodeID"])], gpus
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
    models = _gpu_models(alive)  # before _lock: may read new nodes' GPU properties
    with _lock:
        # A dead node's name is free: only the alive nodes' names are kept as given.
        given = {ray_id: name for ray_id, name in _named.items() if ray_id in alive_ids}
        names = node_names(alive, given)
        taken = set(names.values())
        for ray_id in [r for r, name in _named.items() if r not in alive_ids and name in taken]:
            del _named[ray_id]  # its name went to a node alive now: no longer lost
            _seen.pop(ray_id, None)
        _named.update(names)
        ids = [str(e["NodeID"]) for e in alive]
        nodes = [_info(names[i], e, models.get(i)) for i, e in zip(ids, alive, strict=True)]
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
