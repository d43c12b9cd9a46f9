"""Device catalog: the accelerators autotune knows, with their datasheet figures.

Peak TFLOP/s are dense (no 2:4 sparsity) per GPU; a precision a device has no fast path
for is absent (T4 and V100 have no bf16 units; only Hopper has fp8). Bandwidths are GB/s
per direction. Each entry names its source; ``assumed`` entries say what they stand for.
A GPU the catalog has no entry for is recognised from its own properties
(``autotune.catalog.detect``) and registered here (``register_device``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

from autotune.core import NodeInfo

__all__ = [
    "CATALOG",
    "DEFAULT_INTER_NODE_GBPS",
    "DeviceSpec",
    "calibrated_device",
    "device",
    "node_info",
    "register_device",
]

GIB: Final = 1 << 30

# Network between nodes when a trace does not say: 100 Gb/s Ethernet = 12.5 GB/s per
# direction, the common NIC of the GPU servers in the Alibaba and Pollux testbeds' era.
DEFAULT_INTER_NODE_GBPS: Final = 12.5

# PCIe 3.0 x16 moves 15.75 GB/s per direction (128b/130b encoding at 8 GT/s); PCIe 4.0
# doubles it. GPUs without NVLink talk to each other over PCIe.
_PCIE3_GBPS: Final = 15.75
_PCIE4_GBPS: Final = 31.5


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    name: str
    memory_gib: float
    memory_bandwidth_gbps: float
    """HBM/GDDR bandwidth, GB/s."""
    peak_tflops: MappingProxyType[str, float] = field(default_factory=lambda: MappingProxyType({}))
    intra_node_bandwidth_gbps: float
    """GPU-to-GPU inside one server, GB/s per direction (NVLink aggregate or PCIe)."""
    tdp_watts: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


def _spec(
    name: str,
    *,
    memory_gib: float,
    memory_bandwidth_gbps: float,
    tflops: dict[str, float],
    intra_node_bandwidth_gbps: float,
    tdp_watts: float,
    source: str,
) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        memory_gib=memory_gib,
        memory_bandwidth_gbps=memory_bandwidth_gbps,
        peak_tflops=MappingProxyType(tflops),
        intra_node_bandwidth_gbps=intra_node_bandwidth_gbps,
        tdp_watts=tdp_watts,
        source=source,
    )


_ENTRIES: Final = (
    _spec(
        "T4",
        memory_gib=16,
        memory_bandwidth_gbps=320,
        tflops={"fp32": 8.1, "fp16": 65.0},
        intra_node_bandwidth_gbps=_PCIE3_GBPS,
        tdp_watts=70,
        source="NVIDIA T4 datasheet (fp16 = Turing tensor cores, mixed precision)",
    ),
    _spec(
        "P100",
        memory_gib=16,
        memory_bandwidth_gbps=732,
        tflops={"fp32": 9.3, "fp16": 18.7},
        intra_node_bandwidth_gbps=_PCIE3_GBPS,
        tdp_watts=250,
        source="NVIDIA Tesla P100 PCIe datasheet",
    ),
    _spec(
        "V100M16",
        memory_gib=16,
        memory_bandwidth_gbps=900,
        tflops={"fp32": 15.7, "fp16": 125.0},
        intra_node_bandwidth_gbps=150,
        tdp_watts=300,
        source="NVIDIA V100 SXM2 datasheet; NVLink 2: 300 GB/s per GPU both ways",
    ),
    _spec(
        "V100M32",
        memory_gib=32,
        memory_bandwidth_gbps=900,
        tflops={"fp32": 15.7, "fp16": 125.0},
        intra_node_bandwidth_gbps=150,
        tdp_watts=300,
        source="NVIDIA V100 SXM2 32 GB datasheet; NVLink 2",
    ),
    _spec(
        "RTX2080Ti",
        memory_gib=11,
        memory_bandwidth_gbps=616,
        tflops={"fp32": 13.4, "fp16": 53.8},
        intra_node_bandwidth_gbps=_PCIE3_GBPS,
        tdp_watts=250,
        source=(
            "NVIDIA Turing architecture whitepaper, GeForce RTX 2080 Ti (fp16 = tensor "
            "cores with fp32 accumulate, as mixed-precision training runs)"
        ),
    ),
    _spec(
        "A10",
        memory_gib=24,
        memory_bandwidth_gbps=600,
        tflops={"fp32": 31.2, "bf16": 125.0, "fp16": 125.0},
        intra_node_bandwidth_gbps=_PCIE4_GBPS,
        tdp_watts=150,
        source="NVIDIA A10 datasheet (dense tensor-core figures)",
    ),
    _spec(
        "G2",
        memory_gib=24,
        memory_bandwidth_gbps=600,
        tflops={"fp32": 31.2, "bf16": 125.0, "fp16": 125.0},
        intra_node_bandwidth_gbps=_PCIE4_GBPS,
        tdp_watts=150,
        source=(
            "assumed: the Alibaba v2023 trace does not disclose G2 (549 eight-GPU nodes, "
            "96 cores, 384 GiB); taken as an A10-class PCIe Ampere GPU"
        ),
    ),
    _spec(
        "G3",
        memory_gib=80,
        memory_bandwidth_gbps=2039,
        tflops={"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
        intra_node_bandwidth_gbps=300,
        tdp_watts=400,
        source=(
            "assumed: the Alibaba v2023 trace does not disclose G3 (39 eight-GPU nodes, "
            "128 cores, 768 GiB); taken as an A100-SXM4-80GB-class GPU"
        ),
    ),
    _spec(
        "A100",
        memory_gib=80,
        memory_bandwidth_gbps=2039,
        tflops={"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
        intra_node_bandwidth_gbps=300,
        tdp_watts=400,
        source="NVIDIA A100 SXM4 80 GB datasheet; NVLink 3: 600 GB/s both ways",
    ),
    _spec(
        "A100M40",
        memory_gib=40,
        memory_bandwidth_gbps=1555,
        tflops={"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
        intra_node_bandwidth_gbps=300,
        tdp_watts=400,
        source="NVIDIA A100 SXM4 40 GB datasheet (DGX A100); NVLink 3",
    ),
    _spec(
        "H100",
        memory_gib=80,
        memory_bandwidth_gbps=3350,
        tflops={"fp32": 67.0, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        intra_node_bandwidth_gbps=450,
        tdp_watts=700,
        source="NVIDIA H100 SXM5 datasheet; NVLink 4: 900 GB/s both ways",
    ),
    _spec(
        "H200",
        memory_gib=141,
        memory_bandwidth_gbps=4800,
        tflops={"fp32": 67.0, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        intra_node_bandwidth_gbps=450,
        tdp_watts=700,
        source="NVIDIA H200 SXM datasheet; NVLink 4",
    ),
    _spec(
        "MI210",
        memory_gib=64,
        memory_bandwidth_gbps=1638,
        tflops={"fp32": 45.3, "bf16": 181.0, "fp16": 181.0},
        intra_node_bandwidth_gbps=150,
        tdp_watts=300,
        source="AMD Instinct MI210 datasheet (fp32 = matrix cores); Infinity Fabric links",
    ),
    _spec(
        "CPU",
        memory_gib=64,
        memory_bandwidth_gbps=200,
        tflops={"fp32": 2.0},
        intra_node_bandwidth_gbps=50,
        tdp_watts=250,
        source=(
            "assumed: one server socket as a device; 32 cores x 2 AVX-512 FMA units x 16 "
            "fp32 lanes x 2 FLOP x 2.0 GHz = 4.1 TFLOP/s peak, halved for sustained; no "
            "fast 16-bit path assumed (PyTorch's bf16 training measured 0.64x its fp32 on "
            "an AMD EPYC with AVX-512 BF16; a CPU with bf16 matrix units, AMX, is faster: "
            "autotune calibrate measures it)"
        ),
    ),
)

CATALOG: Final[MappingProxyType[str, DeviceSpec]] = MappingProxyType(
    {spec.name: spec for spec in _ENTRIES}
)


_REGISTERED: dict[str, DeviceSpec] = {}
"""Devices defined outside the catalog in this process: calibrated ones, registered when
the cluster file that defines them is loaded (``autotune.catalog.clusters``), and GPUs
recognised from their properties (``autotune.executor.cluster``)."""


def device(name: str) -> DeviceSpec:
    """The catalog entry for ``name``, or the registered device of that name (a calibrated
    one, a GPU recognised from its properties), or the part of that name in the table of
    known parts (``autotune.catalog.detect``); ``KeyError`` with the known names if none."""
    found = CATALOG.get(name) or _REGISTERED.get(name)
    if found is not None:
        return found
    from autotune.catalog.detect import KNOWN_PARTS

    found = KNOWN_PARTS.get(name)
    if found is None:
        known = ", ".join(dict.fromkeys([*CATALOG, *_REGISTERED, *KNOWN_PARTS]))
        raise KeyError(f"unknown GPU model {name!r}; known: {known}")
    return found


def calibrated_device(base: DeviceSpec, tflops: Mapping[str, float]) -> DeviceSpec:
    """``base`` with the dense peaks a calibration fitted (``autotune calibrate``), named
    ``<base>-calibrated``; a precision absent from ``tflops`` has no fast path."""
    return replace(
        base,
        name=f"{base.name}-calibrated",
        peak_tflops=MappingProxyType(dict(tflops)),
        source=f"calibrated from measured step times on {base.name}",
    )


def register_device(spec: DeviceSpec) -> None:
    """Make ``device(spec.name)`` answer ``spec`` in this process (a later registration of
    the name replaces an earlier one: a newer calibration); the catalog's names cannot be
    replaced."""
    if spec.name in CATALOG:
        raise ValueError(f"{spec.name!r} is a catalog device: a calibrated one needs its own name")
    _REGISTERED[spec.name] = spec


def node_info(
    node_id: str,
    *,
    gpu_model: str,
    gpu_count: int,
    cpu_milli: int,
    memory_mib: int,
    inter_node_bandwidth_gbps: float = DEFAULT_INTER_NODE_GBPS,
    backend_node_id: str = "",
) -> NodeInfo:
    """A ``NodeInfo`` whose GPU figures come from the catalog (``""``: CPU-only node)."""
    if gpu_count == 0 or not gpu_model:
        return NodeInfo(
            node_id=node_id,
            gpu_model="",
            gpu_count=0,
            gpu_memory_bytes=0,
            intra_node_bandwidth_gbps=_PCIE3_GBPS,
            inter_node_bandwidth_gbps=inter_node_bandwidth_gbps,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            backend_node_id=backend_node_id,
        )
    spec = device(gpu_model)
    return NodeInfo(
        node_id=node_id,
        gpu_model=spec.name,
        gpu_count=gpu_count,
        gpu_memory_bytes=spec.memory_bytes,
        peak_tflops=dict(spec.peak_tflops),
        intra_node_bandwidth_gbps=spec.intra_node_bandwidth_gbps,
        inter_node_bandwidth_gbps=inter_node_bandwidth_gbps,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        backend_node_id=backend_node_id,
    )
