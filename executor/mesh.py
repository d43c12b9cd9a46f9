"""A rank's place in its job: its coordinates in the ``("pp", "dp", "tp")`` device mesh
and the process groups behind the mesh.

Ranks are numbered as ``Layout`` says, tensor parallelism innermost (``rank = (pp_index
* dp + dp_index) * tp + tp_index``), the order of torchtitan's device mesh, so the mesh's
``"tp"``, ``"dp"`` and ``"pp"`` dimensions are the ranks' tensor-parallel, data-parallel
and pipeline groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from autotune.core import Layout

__all__ = [
    "MESH_DIMS",
    "RankCoordinates",
    "bind_interface",
    "init_mesh",
    "interface_of",
    "process_group_backend",
]

MESH_DIMS = ("pp", "dp", "tp")
"""The device mesh's dimensions, outermost first."""

_TIMEOUT = timedelta(seconds=300)
"""How long a collective (the rendezvous included) waits for the other ranks."""


@dataclass(frozen=True, slots=True)
class RankCoordinates:
    """Where a rank sits in the mesh: its pipeline stage, data-parallel replica and
    tensor-parallel shard."""

    pp_index: int
    dp_index: int
    tp_index: int

    @classmethod
    def of(cls, rank: int, layout: Layout) -> RankCoordinates:
        """The coordinates of ``rank`` in ``layout`` (see the module docstring)."""
        if not 0 <= rank < layout.world_size:
            raise ValueError(f"rank {rank} is outside a world of {layout.world_size}")
        return cls(
            pp_index=rank // (layout.dp * layout.tp),
            dp_index=(rank // layout.tp) % layout.dp,
            tp_index=rank % layout.tp,
        )


def process_group_backend(device: str) -> str:
    """torch.distributed's backend for ranks on ``device`` (``cpu`` or ``cuda``). On GPUs,
    CUDA tensors go through NCCL and the small CPU tensors the ranks agree on (the
    skip-step flags) through gloo: NCCL cannot reduce CPU tensors."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""Where gloo and NCCL read the network interface to talk on."""


def interface_of(address: str) -> str | None:
    """The network interface of this machine that holds ``address``, or ``None``."""
    import socket

    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(
            a.family in (socket.AF_INET, socket.AF_INET6) and a.address == address
            for a in addresses
        ):
            return str(name)
    return None


def bind_interface(address: str) -> str | None:
    """Make gloo and NCCL talk on the interface that holds ``address`` (the address the
    cluster knows this rank's node by), unless the user chose one (``GLOO_SOCKET_IFNAME``,
    ``NCCL_SOCKET_IFNAME``). Without it, gloo advertises the address the host name
    resolves to, which on many hosts is a loopback address the other nodes cannot reach.
    Returns the interface chosen (``None``: none holds the address, nothing set)."""
    interface = interface_of(address)
    if interface is not None:
        for var in _IFNAME_VARS:
            os.environ.setdefault(var, interface)
    return interface


def init_mesh(*, device: str, layout: Layout, rank: int, address: str, port: int) -> Any:
    """Join the job's process group (rank 0 listens at ``address:port``) and return the
    ``("pp", "dp", "tp")`` device mesh over it. On ``cuda`` the rank's GPU must be
    chosen first (``torch.cuda.set_device``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        process_group_backend(device),
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=layout.world_size,
        timeout=_TIMEOUT,
    )
    return init_device_mesh(device, (layout.pp, layout.dp, layout.tp), mesh_dim_names=MESH_DIMS)
