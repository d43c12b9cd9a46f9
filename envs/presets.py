"""The clusters autotune builds by name, once: the daemon's built-in simulated cluster, the
small one of quick tests and training, and the clusters of the public traces' own papers.

- ``default_nodes()``: 2 x 8 A100, 8 V100-32GB, 2 x 4 T4 (32 GPUs); the daemon's sim backend
  and ``autotune/Cluster-v0``;
- ``small_nodes()``: 2 x 4 A100, 2 x 4 T4 (16 GPUs); ``autotune/ClusterSmall-v0`` and tests;
- ``pollux_nodes(gpus)``: nodes of 4 T4 at the inter-node bandwidth Pollux's measurements
  imply; Pollux workloads in ``autotune eval`` and in training;
- ``philly_nodes(gpus)``: nodes of 8 P100; Philly-style traces in ``autotune eval``.
"""

from __future__ import annotations

from typing import Final

from autotune.catalog.devices import node_info
from autotune.core import NodeInfo
from autotune.errors import InputError

__all__ = [
    "POLLUX_GPU",
    "POLLUX_INTER_NODE_GBPS",
    "default_nodes",
    "philly_nodes",
    "pollux_nodes",
    "small_nodes",
]

POLLUX_GPU: Final = "T4"
"""The GPU of Pollux's testbed: AWS g4dn.12xlarge nodes, 4 NVIDIA T4 each."""
POLLUX_INTER_NODE_GBPS: Final = 6.25
"""g4dn.12xlarge: "up to 50 Gbps" networking (AWS instance type page) = 6.25 GB/s."""


def default_nodes() -> list[NodeInfo]:
    """Two 8xA100 servers, one 8xV100-32GB and two 4xT4: 32 GPUs of three generations."""

    def make(node_id: str, model: str, gpus: int, cores: int, gib: int) -> NodeInfo:
        return node_info(
            node_id,
            gpu_model=model,
            gpu_count=gpus,
            cpu_milli=cores * 1000,
            memory_mib=gib * 1024,
        )

    return [
        make("a100-0", "A100", 8, 128, 1024),
        make("a100-1", "A100", 8, 128, 1024),
        make("v100-0", "V100M32", 8, 96, 512),
        make("t4-0", "T4", 4, 64, 256),
        make("t4-1", "T4", 4, 64, 256),
    ]


def small_nodes() -> list[NodeInfo]:
    """Two 4xA100 and two 4xT4 servers."""
    return [
        node_info(
            f"{m.lower()}-{i}", gpu_model=m, gpu_count=4, cpu_milli=64_000, memory_mib=256 * 1024
        )
        for m in ("A100", "T4")
        for i in range(2)
    ]


def pollux_nodes(gpus: int) -> list[NodeInfo]:
    """Pollux's testbed (Qiao et al., OSDI 2021): nodes of 4 T4 GPUs, ``gpus`` in all, on the
    inter-node bandwidth its measurements imply."""
    if gpus < 4 or gpus % 4:
        raise InputError(f"{gpus} GPUs: Pollux nodes have 4 GPUs each")
    return [
        node_info(
            f"t4-{i}",
            gpu_model=POLLUX_GPU,
            gpu_count=4,
            cpu_milli=48_000,
            memory_mib=192 * 1024,
            inter_node_bandwidth_gbps=POLLUX_INTER_NODE_GBPS,
        )
        for i in range(gpus // 4)
    ]


def philly_nodes(gpus: int) -> list[NodeInfo]:
    """Philly-style nodes of 8 P100 GPUs, ``gpus`` in all."""
    if gpus < 8 or gpus % 8:
        raise InputError(f"{gpus} GPUs: Philly-style nodes have 8 GPUs each")
    return [
        node_info(
            f"p100-{i}", gpu_model="P100", gpu_count=8, cpu_milli=64_000, memory_mib=512 * 1024
        )
        for i in range(gpus // 8)
    ]
