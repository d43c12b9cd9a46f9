"""The clusters autotune builds by name, once: the daemon's built-in simulated cluster, the
small one of quick tests and training, and the clusters of the public traces' own papers.

- ``default_nodes()``: 2 x 8 A100, 8 V100-32GB, 2 x 4 T4 (32 GPUs); the daemon's sim backend
  and ``autotune/Cluster-v0``;
- ``small_nodes()``: 2 x 4 A100, 2 x 4 T4 (16 GPUs); ``autotune/ClusterSmall-v0`` and tests;
- ``pollux_nodes(gpus)``: nodes of 4 T4 at the inter-node bandwidth Pollux's measurements
  imply; Pollux workloads in ``autotune eval`` and in training;
- ``philly_nodes(gpus)``: nodes of 8 P100; Philly-style traces in ``autotune eval``;
- ``drawn_cluster(rng)``: a cluster drawn from a distribution of sizes (16 to 512 GPUs),
  mixes of ``CLUSTER_MODELS`` and link speeds (``LINK_GBPS``): training a policy for
  clusters no one named.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from autotune.catalog.devices import device, node_info
from autotune.core import NodeInfo
from autotune.errors import InputError

__all__ = [
    "CLUSTER_MODELS",
    "LINK_GBPS",
    "POLLUX_GPU",
    "POLLUX_INTER_NODE_GBPS",
    "default_nodes",
    "drawn_cluster",
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


CLUSTER_MODELS: Final = ("T4", "A10", "V100M32", "A100", "H100")
"""The GPU models a drawn cluster mixes: five generations and classes (P100, V100M16, H200
and the Alibaba trace's G2/G3 are left out, so a policy trained on drawn clusters can be
tested on devices it never saw)."""
LINK_GBPS: Final = (1.25, 3.125, 6.25, 12.5, 25.0, 50.0)
"""Inter-node bandwidths (GB/s) a drawn cluster's nodes have: 10, 25, 50, 100, 200 and 400
Gbit/s."""
_SMALL_NODE_BYTES: Final = 24 * (1 << 30)
"""GPUs with at most this much memory (T4, A10: PCIe inference-class cards) come 4 to a
node; the others 8."""


def drawn_cluster(
    rng: np.random.Generator,
    *,
    gpus: tuple[int, int] = (16, 512),
    models: tuple[str, ...] = CLUSTER_MODELS,
    links: tuple[float, ...] = LINK_GBPS,
) -> list[NodeInfo]:
    """A cluster drawn at random: about ``gpus`` GPUs in all (log-uniform between the
    bounds), of 1 to 3 of ``models`` in shares drawn uniformly (Dirichlet(1)), each
    model's GPUs on nodes of 4 (small cards) or 8, at least one node each, every node on
    one inter-node bandwidth drawn from ``links``."""
    low, high = gpus
    if not 1 <= low <= high:
        raise InputError(f"gpus={gpus!r}: need 1 <= low <= high")
    if not models or not links:
        raise InputError("a drawn cluster needs at least one GPU model and one link speed")
    total = math.exp(rng.uniform(math.log(low), math.log(high)))
    count = int(rng.integers(1, min(3, len(models)) + 1))
    chosen = [str(m) for m in rng.choice(models, size=count, replace=False)]
    shares = rng.dirichlet(np.ones(count))
    bandwidth = float(rng.choice(links))
    nodes: list[NodeInfo] = []
    for model, share in zip(chosen, shares, strict=True):
        per = 4 if device(model).memory_bytes <= _SMALL_NODE_BYTES else 8
        for i in range(max(1, round(total * share / per))):
            nodes.append(
                node_info(
                    f"{model.lower()}-{i}",
                    gpu_model=model,
                    gpu_count=per,
                    cpu_milli=per * 12_000,
                    memory_mib=per * 64 * 1024,
                    inter_node_bandwidth_gbps=bandwidth,
                )
            )
    return nodes
