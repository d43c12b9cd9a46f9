"""The links between a Ray cluster's machines, measured.

For each machine other than the first, one process on it and one on the first join a
two-rank gloo group over the machines' own addresses (the ones Ray knows them by) and
time ``all_reduce``: of ``nbytes`` for the bandwidth (a ring of two ranks sends each
rank's buffer once each way: GB/s = bytes / median time) and of 4 bytes for the
latency. The processes are Ray actors that reserve no CPU, pinned to their nodes.
``autotune cluster describe`` writes what this measures into a cluster file.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from autotune.catalog.clusters import LinkMeasurement
from autotune.core import NodeInfo

__all__ = ["measure_links"]


class _Probe:
    """One end of a link under test."""

    def address(self) -> tuple[str, int]:
        import socket

        import ray

        node = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        with socket.socket() as s:
            s.bind(("", 0))
            return node, int(s.getsockname()[1])

    def run(self, master: str, port: int, rank: int, nbytes: int, repeats: int) -> dict[str, float]:
        from datetime import timedelta

        import ray
        import torch
        import torch.distributed as dist

        from autotune.executor.mesh import bind_interface

        bind_interface(str(ray.util.get_node_ip_address()))  # type: ignore[no-untyped-call]
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master}:{port}",
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=120),
        )
        try:
            out = {}
            for name, size in (("bandwidth", nbytes), ("latency", 4)):
                x = torch.ones(max(1, size // 4))
                dist.all_reduce(x)  # connections and buffers
                times = []
                for _ in range(repeats):
                    dist.barrier()
                    began = time.perf_counter()
                    dist.all_reduce(x)
                    times.append(time.perf_counter() - began)
                out[name] = statistics.median(times)
            return out
        finally:
            dist.destroy_process_group()


def measure_links(
    nodes: Sequence[NodeInfo],
    *,
    nbytes: int = 16 << 20,
    repeats: int = 5,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[LinkMeasurement]:
    """Each node's link to ``nodes[0]``, measured (Ray must be connected; the nodes as
    ``autotune.executor.cluster.ray_cluster`` names them, with their Ray node ids)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if len(nodes) < 2:
        return []
    probe = ray.remote(num_cpus=0)(_Probe)

    def on(node: NodeInfo) -> Any:
        strategy = NodeAffinitySchedulingStrategy(node_id=node.backend_node_id, soft=False)
        return probe.options(scheduling_strategy=strategy).remote()

    first, rest = nodes[0], nodes[1:]
    out = []
    for i, other in enumerate(rest):
        if progress:
            progress(i, len(rest), f"{first.node_id} <-> {other.node_id}")
        a, b = on(first), on(other)
        try:
            master, port = ray.get(a.address.remote(), timeout=120)
            times = ray.get(
                [
                    a.run.remote(master, port, 0, nbytes, repeats),
                    b.run.remote(master, port, 1, nbytes, repeats),
                ],
                timeout=600,
            )
        finally:
            for actor in (a, b):
                ray.kill(actor)
        # The group's time is its slower rank's.
        bandwidth = max(t["bandwidth"] for t in times)
        latency = max(t["latency"] for t in times)
        out.append(
            LinkMeasurement(
                a=first.node_id,
                b=other.node_id,
                gbps=nbytes / bandwidth / 1e9,
                latency_s=latency,
                bytes=nbytes,
            )
        )
    if progress:
        progress(len(rest), len(rest), "done")
    return out
