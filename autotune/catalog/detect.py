"""GPUs the catalog has no entry for, recognised from their own properties.

A GPU reports its name as the driver gives it (``NVIDIA H100 80GB HBM3``, ``NVIDIA L4``,
``AMD Instinct MI300X``), its memory, its SM (AMD: compute unit) count, its compute
capability (AMD: its gfx version) and its clock (``torch_properties``,
``nvml_properties``). ``detected_device`` makes a ``DeviceSpec`` of them:

- **a known part** (the table below, matched on the words of the name, most specific
  first): its datasheet figures, with the memory the device reports. A part that *is* a
  catalog entry (``H100 80GB HBM3`` is the catalog's ``H100``) is that entry where the
  memory agrees within 10% (drivers report a little less than the datasheet: ECC, the
  driver's reserve); else it is a variant named for its memory (``H100-64GB``).
- **an unknown part**: estimated from its properties, SMs x clock x the dense FLOP per
  SM per clock of its architecture (by compute capability, the newest one not above it),
  with the memory bandwidth and power per SM of that generation's reference part;
  PCIe 4.0 between GPUs. Its ``source`` says so.

On NVIDIA the precisions a device has fast units for come from its compute capability:
fp16 tensor cores from 7.0 (GP100, 6.0, runs fp16 at twice fp32), bf16 from 8.0, fp8
from 8.9 (Ada and Hopper on); on AMD from the table. Peaks are dense (no 2:4 sparsity);
consumer cards' tensor figures are those with fp32 accumulation, as training runs them.
AMD's MI250X and MI250 are two dies to ROCm, so their entries are per die.
``assumed_device`` is what a GPU is taken as when neither its properties nor its name
say anything: a T4-class device (the least of the catalog's), named for what it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, Literal

from autotune.catalog.devices import _PCIE3_GBPS, _PCIE4_GBPS, CATALOG, GIB, DeviceSpec, _spec

__all__ = [
    "KNOWN_PARTS",
    "SHARED_NAMES",
    "GpuProperties",
    "assumed_device",
    "detected_device",
    "estimated_device",
    "known_part",
    "nvml_properties",
    "precision_units",
    "torch_properties",
]

Vendor = Literal["NVIDIA", "AMD"]

# PCIe 5.0 x16: 32 GT/s, 128b/130b, per direction.
_PCIE5_GBPS: Final = 63.0
# A known part that is a catalog entry is that entry when the memory the device reports is
# within this fraction of the catalog's.
_SAME_MEMORY: Final = 0.10
_VENDOR_WORDS: Final = frozenset({"NVIDIA", "TESLA", "GEFORCE", "AMD", "INSTINCT", "RADEON"})


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProperties:
    """One GPU as its driver describes it."""

    name: str
    """As the driver reports it: ``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX 4090``."""
    total_memory_bytes: int
    multiprocessor_count: int
    """SMs (NVIDIA) or compute units (AMD)."""
    major: int
    minor: int
    """Compute capability (NVIDIA) or gfx version (AMD: 9.4 is gfx942)."""
    clock_mhz: float | None = None
    """The SM clock at boost; ``None``: not reported."""
    vendor: Vendor = "NVIDIA"

    @property
    def memory_gib(self) -> float:
        return self.total_memory_bytes / GIB


def torch_properties(index: int = 0) -> GpuProperties | None:
    """GPU ``index`` as ``torch.cuda`` sees it (CUDA or ROCm); ``None`` where torch sees
    no such GPU (a CPU machine, a CPU build of torch)."""
    try:
        import torch

        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        props = torch.cuda.get_device_properties(index)
    except (ImportError, RuntimeError, AssertionError):
        return None
    clock_khz = getattr(props, "clock_rate", None)  # newer torch only
    return GpuProperties(
        name=str(props.name),
        total_memory_bytes=int(props.total_memory),
        multiprocessor_count=int(props.multi_processor_count),
        major=int(props.major),
        minor=int(props.minor),
        clock_mhz=clock_khz / 1000 if clock_khz else None,
        vendor="AMD" if torch.version.hip else "NVIDIA",
    )


def nvml_properties(index: int = 0) -> GpuProperties | None:
    """NVIDIA GPU ``index`` as NVML (``nvidia-ml-py``) sees it, whatever
    ``CUDA_VISIBLE_DEVICES`` says; ``None`` without an NVIDIA driver, without that GPU,
    or on a driver that does not report its core count."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no libnvidia-ml, no driver: a machine without NVIDIA GPUs
        return None
    try:
        if index >= pynvml.nvmlDeviceGetCount():
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        cores = int(pynvml.nvmlDeviceGetNumGpuCores(handle))
        clock = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    return GpuProperties(
        name=name.decode() if isinstance(name, bytes) else str(name),
        total_memory_bytes=memory,
        multiprocessor_count=cores // _arch("NVIDIA", major, minor).cores_per_sm,
        major=int(major),
        minor=int(minor),
        clock_mhz=clock or None,
    )


def precision_units(props: GpuProperties) -> frozenset[str]:
    """The precisions ``props``'s device has fast units for: by compute capability on
    NVIDIA, by its architecture's entry on AMD."""
    if props.vendor == "AMD":
        return frozenset(_arch("AMD", props.major, props.minor).flop_per_clock)
    cc = (props.major, props.minor)
    units = {"fp32"}
    if cc >= (7, 0) or cc == (6, 0):
        units.add("fp16")
    if cc >= (8, 0):
        units.add("bf16")
    if cc >= (8, 9):
        units.add("fp8")
    return frozenset(units)


# --------------------------------------------------------------------------------------
# The table of known parts
# --------------------------------------------------------------------------------------


def _part(name: str, *, source: str, **figures: Any) -> DeviceSpec:
    """An entry of the table: ``_spec``'s figures, its source marked as the table's."""
    return _spec(name, source=f"table of known parts: {source}", **figures)


_A10 = CATALOG["A10"]

# (the words the reported name must hold, the part), most specific first.
_PARTS: Final[tuple[tuple[frozenset[str], DeviceSpec], ...]] = tuple(
    (frozenset(words.split()), spec)
    for words, spec in (
        (
            "H100 PCIE",
            _part(
                "H100-PCIe",
                memory_gib=80,
                memory_bandwidth_gbps=2039,
                tflops={"fp32": 51.2, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
                intra_node_bandwidth_gbps=_PCIE5_GBPS,
                tdp_watts=350,
                source="NVIDIA H100 PCIe datasheet; PCIe 5.0 x16 between GPUs",
            ),
        ),
        (
            "H100 NVL",
            _part(
                "H100-NVL",
                memory_gib=94,
                memory_bandwidth_gbps=3938,
                tflops={"fp32": 60.0, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
                intra_node_bandwidth_gbps=300,
                tdp_watts=400,
                source="NVIDIA H100 NVL datasheet; NVLink bridge: 600 GB/s both ways",
            ),
        ),
        ("H100", CATALOG["H100"]),  # SXM5 80 GB (``NVIDIA H100 80GB HBM3``), Ray's ``H100``
        (
            "H200 NVL",
            _part(
                "H200-NVL",
                memory_gib=141,
                memory_bandwidth_gbps=4800,
                tflops={"fp32": 60.0, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
                intra_node_bandwidth_gbps=450,
                tdp_watts=600,
                source="NVIDIA H200 NVL datasheet; NVLink bridge: 900 GB/s both ways",
            ),
        ),
        ("H200", CATALOG["H200"]),
        (
            "B200",
            _part(
                "B200",
                memory_gib=180,
                memory_bandwidth_gbps=8000,
                tflops={"fp32": 75.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
                intra_node_bandwidth_gbps=900,
                tdp_watts=1000,
                source="NVIDIA HGX B200 datasheet per GPU; NVLink 5: 1.8 TB/s both ways",
            ),
        ),
        (
            "A100 PCIE 40GB",
            _part(
                "A100-PCIe-40GB",
                memory_gib=40,
                memory_bandwidth_gbps=1555,
                tflops={"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=250,
                source="NVIDIA A100 PCIe 40 GB datasheet; PCIe 4.0 x16 between GPUs",
            ),
        ),
        (
            "A100 PCIE",
            _part(
                "A100-PCIe",
                memory_gib=80,
                memory_bandwidth_gbps=1935,
                tflops={"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=300,
                source="NVIDIA A100 PCIe 80 GB datasheet; PCIe 4.0 x16 between GPUs",
            ),
        ),
        (
            "A100 40GB",
            _part(
                "A100-40GB",
                memory_gib=40,
                memory_bandwidth_gbps=1555,
                tflops={"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
                intra_node_bandwidth_gbps=300,
                tdp_watts=400,
                source="NVIDIA A100 SXM4 40 GB datasheet; NVLink 3: 600 GB/s both ways",
            ),
        ),
        ("A100", CATALOG["A100"]),  # SXM4 80 GB (``NVIDIA A100-SXM4-80GB``), Ray's ``A100``
        (
            "L40S",
            _part(
                "L40S",
                memory_gib=48,
                memory_bandwidth_gbps=864,
                tflops={"fp32": 91.6, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=350,
                source="NVIDIA L40S datasheet; PCIe 4.0 x16 between GPUs",
            ),
        ),
        (
            "L40",
            _part(
                "L40",
                memory_gib=48,
                memory_bandwidth_gbps=864,
                tflops={"fp32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=300,
                source="NVIDIA L40 datasheet; PCIe 4.0 x16 between GPUs",
            ),
        ),
        (
            "L4",
            _part(
                "L4",
                memory_gib=24,
                memory_bandwidth_gbps=300,
                tflops={"fp32": 30.3, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=72,
                source="NVIDIA L4 datasheet; PCIe 4.0 x16 between GPUs",
            ),
        ),
        (
            "A40",
            _part(
                "A40",
                memory_gib=48,
                memory_bandwidth_gbps=696,
                tflops={"fp32": 37.4, "bf16": 149.7, "fp16": 149.7},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=300,
                source="NVIDIA A40 datasheet; PCIe 4.0 x16 between GPUs",
            ),
        ),
        (
            "A10G",
            _part(
                "A10G",
                memory_gib=24,
                memory_bandwidth_gbps=_A10.memory_bandwidth_gbps,
                tflops=dict(_A10.peak_tflops),
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=300,
                source=(
                    "A10G, AWS G5's GA102 (NVIDIA publishes no datasheet): taken as the A10 "
                    "datasheet's figures at AWS's 300 W"
                ),
            ),
        ),
        ("A10", _A10),
        (
            "RTX 4090",
            _part(
                "RTX4090",
                memory_gib=24,
                memory_bandwidth_gbps=1008,
                tflops={"fp32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=450,
                source=(
                    "NVIDIA Ada Lovelace whitepaper, GeForce RTX 4090 (tensor figures with "
                    "fp32 accumulate); PCIe 4.0 x16 between GPUs"
                ),
            ),
        ),
        (
            "RTX 3090",
            _part(
                "RTX3090",
                memory_gib=24,
                memory_bandwidth_gbps=936,
                tflops={"fp32": 35.6, "bf16": 71.0, "fp16": 71.0},
                intra_node_bandwidth_gbps=_PCIE4_GBPS,
                tdp_watts=350,
                source=(
                    "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090 (tensor figures with "
                    "fp32 accumulate); PCIe 4.0 x16 between GPUs"
                ),
            ),
        ),
        ("T4", CATALOG["T4"]),
        (
            "V100 PCIE",
            _part(
                "V100-PCIe",
                memory_gib=16,
                memory_bandwidth_gbps=900,
                tflops={"fp32": 14.0, "fp16": 112.0},
                intra_node_bandwidth_gbps=_PCIE3_GBPS,
                tdp_watts=250,
                source="NVIDIA V100 PCIe datasheet; PCIe 3.0 x16 between GPUs",
            ),
        ),
        ("V100 32GB", CATALOG["V100M32"]),
        ("V100", CATALOG["V100M16"]),
        ("P100", CATALOG["P100"]),
        (
            "MI325X",
            _part(
                "MI325X",
                memory_gib=256,
                memory_bandwidth_gbps=6000,
                tflops={"fp32": 163.4, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
                intra_node_bandwidth_gbps=448,
                tdp_watts=1000,
                source=(
                    "AMD Instinct MI325X datasheet (fp32 = matrix cores); 7 Infinity Fabric "
                    "links of 128 GB/s both ways"
                ),
            ),
        ),
        (
            "MI300X",
            _part(
                "MI300X",
                memory_gib=192,
                memory_bandwidth_gbps=5300,
                tflops={"fp32": 163.4, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
                intra_node_bandwidth_gbps=448,
                tdp_watts=750,
                source=(
                    "AMD Instinct MI300X datasheet (fp32 = matrix cores); 7 Infinity Fabric "
                    "links of 128 GB/s both ways"
                ),
            ),
        ),
        (
            "MI250",  # ``MI250X / MI250``, as ROCm names the MI250
            _part(
                "MI250",
                memory_gib=64,
                memory_bandwidth_gbps=1638.4,
                tflops={"fp32": 45.25, "bf16": 181.05, "fp16": 181.05},
                intra_node_bandwidth_gbps=100,
                tdp_watts=250,
                source=(
                    "AMD Instinct MI250 datasheet, halved: one of its two dies, a device to "
                    "ROCm (fp32 = matrix cores); Infinity Fabric taken as 100 GB/s each way"
                ),
            ),
        ),
        (
            "MI250X",
            _part(
                "MI250X",
                memory_gib=64,
                memory_bandwidth_gbps=1638.4,
                tflops={"fp32": 47.85, "bf16": 191.5, "fp16": 191.5},
                intra_node_bandwidth_gbps=100,
                tdp_watts=280,
                source=(
                    "AMD Instinct MI250X datasheet, halved: one of its two dies, a device to "
                    "ROCm (fp32 = matrix cores); Infinity Fabric taken as 100 GB/s each way"
                ),
            ),
        ),
        ("MI210", CATALOG["MI210"]),
    )
)

KNOWN_PARTS: Final[Mapping[str, DeviceSpec]] = MappingProxyType(
    {spec.name: spec for _, spec in _PARTS if spec.name not in CATALOG}
)
"""The table's parts that are not catalog entries, by name: ``device`` answers them."""


SHARED_NAMES: Final = frozenset(
    spec.name
    for needed, spec in _PARTS
    if spec.name in CATALOG and any(needed < other for other, _ in _PARTS)
)
"""Catalog names that other parts go by too: Ray calls an H100 PCIe ``H100``, an A100
PCIe ``A100``. Only the device's own properties tell which part it is."""


def _words(name: str) -> list[str]:
    """The words of a reported name, vendor words dropped, case kept."""
    return [w for w in re.split(r"[^A-Za-z0-9]+", name) if w and w.upper() not in _VENDOR_WORDS]


def known_part(name: str) -> DeviceSpec | None:
    """The table's part named ``name`` as a driver reports it (``NVIDIA L4``) or as Ray
    calls it (``L4``, ``GeForce-RTX-4090``, ``AMD-Instinct-MI300X-OAM``), with its
    datasheet's memory; ``None`` if no part matches."""
    words = {re.sub(r"^(\d+)G$", r"\1GB", w.upper()) for w in _words(name)}
    return next((spec for needed, spec in _PARTS if needed <= words), None)


# --------------------------------------------------------------------------------------
# Unknown parts: an estimate from the architecture
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Arch:
    name: str
    flop_per_clock: Mapping[str, int]
    """Dense FLOP per SM (AMD: per compute unit) per clock, by precision."""
    clock_mhz: float
    """A boost clock of the generation, for a device that reports none."""
    reference: str
    """The part the per-SM bandwidth and power are taken from."""
    gbps_per_sm: float
    watts_per_sm: float
    cores_per_sm: int = 64
    """fp32 lanes per SM (NVML reports cores, not SMs)."""


_ARCHS: Final[Mapping[tuple[Vendor, int, int], _Arch]] = MappingProxyType(
    {
        ("NVIDIA", 6, 0): _Arch(
            "Pascal GP100", {"fp32": 128, "fp16": 256}, 1300, "P100 PCIe", 732 / 56, 250 / 56
        ),
        ("NVIDIA", 6, 1): _Arch(
            "Pascal GP10x", {"fp32": 256}, 1530, "Tesla P40", 346 / 30, 250 / 30, 128
        ),
        ("NVIDIA", 7, 0): _Arch(
            "Volta", {"fp32": 128, "fp16": 1024}, 1530, "V100 SXM2", 900 / 80, 300 / 80
        ),
        ("NVIDIA", 7, 5): _Arch(
            "Turing", {"fp32": 128, "fp16": 1024}, 1590, "T4", 320 / 40, 70 / 40
        ),
        ("NVIDIA", 8, 0): _Arch(
            "Ampere GA100",
            {"fp32": 128, "bf16": 2048, "fp16": 2048},
            1410,
            "A100 SXM4 80 GB",
            2039 / 108,
            400 / 108,
        ),
        ("NVIDIA", 8, 6): _Arch(
            "Ampere GA10x",
            {"fp32": 256, "bf16": 1024, "fp16": 1024},
            1695,
            "A10",
            600 / 72,
            150 / 72,
            128,
        ),
        ("NVIDIA", 8, 9): _Arch(
            "Ada Lovelace",
            {"fp32": 256, "bf16": 1024, "fp16": 1024, "fp8": 2048},
            2520,
            "L40S",
            864 / 142,
            350 / 142,
            128,
        ),
        ("NVIDIA", 9, 0): _Arch(
            "Hopper",
            {"fp32": 256, "bf16": 4096, "fp16": 4096, "fp8": 8192},
            1830,
            "H100 SXM5",
            3350 / 132,
            700 / 132,
            128,
        ),
        ("NVIDIA", 10, 0): _Arch(
            "Blackwell",
            {"fp32": 256, "bf16": 8192, "fp16": 8192, "fp8": 16384},
            1860,
            "B200",
            8000 / 148,
            1000 / 148,
            128,
        ),
        ("NVIDIA", 12, 0): _Arch(
            "Blackwell RTX",
            {"fp32": 256, "bf16": 1024, "fp16": 1024, "fp8": 2048},
            2600,
            "RTX PRO 6000 Blackwell",
            1792 / 188,
            600 / 188,
            128,
        ),
        ("AMD", 9, 0): _Arch(
            "CDNA2",
            {"fp32": 256, "bf16": 1024, "fp16": 1024},
            1700,
            "MI250X die",
            1638.4 / 110,
            280 / 110,
        ),
        ("AMD", 9, 4): _Arch(
            "CDNA3",
            {"fp32": 256, "bf16": 2048, "fp16": 2048, "fp8": 4096},
            2100,
            "MI300X",
            5300 / 304,
            750 / 304,
        ),
        ("AMD", 9, 5): _Arch(
            "CDNA4",
            {"fp32": 256, "bf16": 4096, "fp16": 4096, "fp8": 8192},
            2400,
            "MI355X",
            8000 / 256,
            1400 / 256,
        ),
        ("AMD", 11, 0): _Arch(
            "RDNA3",
            {"fp32": 256, "bf16": 512, "fp16": 512},
            2500,
            "RX 7900 XTX",
            960 / 96,
            355 / 96,
        ),
    }
)


def _arch(vendor: Vendor, major: int, minor: int) -> _Arch:
    """The newest architecture of ``vendor`` not above ``major.minor`` (the oldest for
    an older device)."""
    known = sorted((key[1:], arch) for key, arch in _ARCHS.items() if key[0] == vendor)
    below = [arch for cc, arch in known if cc <= (major, minor)]
    return below[-1] if below else known[0][1]


def _short_name(name: str) -> str:
    """A catalog name for a reported one: ``NVIDIA Foo 9000`` -> ``Foo-9000``."""
    short = "-".join(_words(name)) or "GPU"
    return f"{short}-detected" if short in CATALOG else short


def estimated_device(props: GpuProperties, *, name: str | None = None) -> DeviceSpec:
    """An entry for a part no datasheet entry knows, estimated from its properties (see
    the module docstring); named ``name``, else a short form of the reported name."""
    arch = _arch(props.vendor, props.major, props.minor)
    clock = props.clock_mhz or arch.clock_mhz
    sms = props.multiprocessor_count
    units = precision_units(props)
    tflops = {p: sms * clock * 1e6 * rate / 1e12 for p, rate in arch.flop_per_clock.items()}
    unit, version = ("CUs", "gfx") if props.vendor == "AMD" else ("SMs", "cc")
    assumed = "" if props.clock_mhz else " assumed"
    return _spec(
        name or _short_name(props.name),
        memory_gib=props.memory_gib,
        memory_bandwidth_gbps=round(sms * arch.gbps_per_sm, 1),
        tflops={p: round(v, 1) for p, v in tflops.items() if p in units},
        intra_node_bandwidth_gbps=_PCIE4_GBPS,
        tdp_watts=round(sms * arch.watts_per_sm),
        source=(
            f"estimated from device properties ({sms} {unit}, {version} "
            f"{props.major}.{props.minor}, clock {clock:.0f} MHz{assumed}): no datasheet "
            f"entry; {arch.name} FLOP per SM per clock, the {arch.reference}'s memory "
            "bandwidth and power per SM, PCIe 4.0 between GPUs"
        ),
    )


def detected_device(props: GpuProperties) -> DeviceSpec:
    """The catalog entry for the device ``props`` describes: a known part with the memory
    the device reports, else an estimate from its properties (see the module docstring).
    Never another part's entry: an unknown GPU is not an A100."""
    part = known_part(props.name)
    if part is None:
        return estimated_device(props)
    peaks = dict(part.peak_tflops)
    if props.vendor == "NVIDIA":  # its compute capability says which units it has
        units = precision_units(props)
        peaks = {p: v for p, v in peaks.items() if p in units}
    same_memory = abs(props.memory_gib / part.memory_gib - 1) <= _SAME_MEMORY
    if part.name in CATALOG and same_memory and peaks == dict(part.peak_tflops):
        return part
    name = f"{part.name}-{round(props.memory_gib)}GB" if part.name in CATALOG else part.name
    return replace(
        part,
        name=name,
        memory_gib=props.memory_gib,
        peak_tflops=MappingProxyType(peaks),
        source=f"{part.source}; memory as the device reports it",
    )


# What a GPU is taken as when nothing about it can be read: the catalog's T4 (the least of
# its training GPUs), as the Turing estimate gives it.
_ASSUMED: Final[dict[str, Any]] = {
    "total_memory_bytes": 16 * GIB,
    "multiprocessor_count": 40,
    "major": 7,
    "minor": 5,
    "clock_mhz": 1590.0,
}


def assumed_device(name: str) -> DeviceSpec:
    """An entry named ``name`` (what Ray calls the GPU) for a GPU that neither the table
    nor its properties describe: the unknown-part estimate of a T4-class device; its
    ``source`` says so."""
    return replace(
        estimated_device(GpuProperties(name=name, **_ASSUMED), name=name),
        source=(
            f"assumed: no datasheet entry matches {name!r} and its properties could not be "
            "read; estimated as a T4-class GPU (16 GiB, 40 SMs, cc 7.5, clock 1590 MHz)"
        ),
    )
