"""GPUs the catalog has no entry for, recognised from their properties
(``autotune.catalog.detect``): each gets an entry with the memory the device reports and
the precision units its compute capability gives, from the table of known parts or an
estimate, and none is taken for an A100."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import MIB
from helpers import gpu_properties as gpu

from autotune.catalog import devices
from autotune.catalog.detect import (
    GpuProperties,
    assumed_device,
    detected_device,
    known_part,
    nvml_properties,
    precision_units,
    torch_properties,
)
from autotune.catalog.devices import CATALOG, device, register_device
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobConfig, JobSpec, Layout, Placement, RankSlot
from autotune.decision.explain import explain_decision

# Property sets as the readers return them, memory as nvidia-smi reports it (MiB).
H100_SXM = gpu("NVIDIA H100 80GB HBM3", 81559, 132, (9, 0), 1980)
H100_PCIE = gpu("NVIDIA H100 PCIe", 81559, 114, (9, 0), 1755)
L4 = gpu("NVIDIA L4", 23034, 58, (8, 9), 2040)
A10G = gpu("NVIDIA A10G", 23028, 80, (8, 6), 1710)
RTX4090 = gpu("NVIDIA GeForce RTX 4090", 24564, 128, (8, 9), 2520)
FOO = gpu("NVIDIA Foo 9000", 96 * 1024, 120, (10, 0), 1800)
RECORDED = (H100_SXM, H100_PCIE, L4, A10G, RTX4090, FOO)
# name, precisions, figures from: the catalog's datasheet, the table of known parts, an estimate
EXPECTED = {
    H100_SXM: ("H100", {"fp32", "bf16", "fp16", "fp8"}, "NVIDIA H100 SXM5 datasheet"),
    H100_PCIE: ("H100-PCIe", {"fp32", "bf16", "fp16", "fp8"}, "table of known parts"),
    L4: ("L4", {"fp32", "bf16", "fp16", "fp8"}, "table of known parts"),
    A10G: ("A10G", {"fp32", "bf16", "fp16"}, "table of known parts"),
    RTX4090: ("RTX4090", {"fp32", "bf16", "fp16", "fp8"}, "table of known parts"),
    FOO: ("Foo-9000", {"fp32", "bf16", "fp16", "fp8"}, "estimated from device properties"),
}


@pytest.fixture(autouse=True)
def _no_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "_REGISTERED", {})


@pytest.mark.parametrize("props", RECORDED, ids=lambda p: p.name)
def test_each_recorded_gpu_gets_its_own_entry_with_its_memory_and_units(
    props: GpuProperties,
) -> None:
    spec = detected_device(props)
    name, units, source = EXPECTED[props]
    assert spec.name == name
    assert set(spec.peak_tflops) == units
    assert spec.source.startswith(source)
    assert spec.memory_gib == pytest.approx(props.memory_gib, rel=0.02)
    if spec.name not in CATALOG:  # a new entry has exactly the memory the device reports
        assert spec.memory_bytes == props.total_memory_bytes
    assert "A100" not in spec.name
    assert spec != CATALOG["A100"]
    assert dict(spec.peak_tflops) != dict(CATALOG["A100"].peak_tflops)


def test_a_known_part_has_its_datasheet_figures() -> None:
    pcie, l4, a10g, rtx = map(detected_device, (H100_PCIE, L4, A10G, RTX4090))
    assert dict(pcie.peak_tflops) == {"fp32": 51.2, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0}
    assert pcie.memory_bandwidth_gbps == 2039
    assert pcie.tdp_watts == 350
    assert dict(l4.peak_tflops) == {"fp32": 30.3, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}
    assert (l4.memory_bandwidth_gbps, l4.tdp_watts) == (300, 72)
    assert dict(a10g.peak_tflops) == dict(CATALOG["A10"].peak_tflops)
    assert rtx.peak_tflops["fp8"] == 330.3  # with fp32 accumulate, as training runs it
    assert detected_device(H100_SXM) is CATALOG["H100"]  # the catalog's part itself


def test_an_unknown_part_is_estimated_from_its_properties() -> None:
    spec = detected_device(FOO)
    assert spec.source.startswith(
        "estimated from device properties (120 SMs, cc 10.0, clock 1800 MHz): no datasheet entry"
    )
    # 120 SMs x 1.8 GHz x Blackwell's dense FLOP per SM per clock
    assert spec.peak_tflops["bf16"] == round(120 * 1.8e9 * 8192 / 1e12, 1)
    assert spec.peak_tflops["fp8"] == round(120 * 1.8e9 * 16384 / 1e12, 1)
    assert spec.peak_tflops["fp32"] == round(120 * 1.8e9 * 256 / 1e12, 1)
    assert spec.memory_gib == 96
    no_clock = detected_device(gpu("NVIDIA Bar", 8 * 1024, 20, (7, 5)))
    assert no_clock.name == "Bar"
    assert set(no_clock.peak_tflops) == {"fp32", "fp16"}  # Turing: no bf16, no fp8
    assert "clock 1590 MHz assumed" in no_clock.source


def test_a_catalog_part_with_other_memory_is_a_variant_not_the_catalog_entry() -> None:
    spec = detected_device(gpu("NVIDIA H100 SXM5 64GB", 64 * 1024, 132, (9, 0)))
    assert spec.name == "H100-64GB"
    assert spec.memory_gib == 64
    assert dict(spec.peak_tflops) == dict(CATALOG["H100"].peak_tflops)
    assert detected_device(gpu("NVIDIA A100-SXM4-40GB", 40536, 108, (8, 0))).name == "A100-40GB"
    a100_80 = gpu("NVIDIA A100-SXM4-80GB", 81050, 108, (8, 0))
    assert detected_device(a100_80) is CATALOG["A100"]  # the same part: the catalog's


@pytest.mark.parametrize(
    ("cc", "units"),
    [
        ((6, 1), {"fp32"}),
        ((7, 0), {"fp32", "fp16"}),
        ((7, 5), {"fp32", "fp16"}),
        ((8, 0), {"fp32", "fp16", "bf16"}),
        ((8, 6), {"fp32", "fp16", "bf16"}),
        ((8, 9), {"fp32", "fp16", "bf16", "fp8"}),
        ((9, 0), {"fp32", "fp16", "bf16", "fp8"}),
        ((12, 0), {"fp32", "fp16", "bf16", "fp8"}),
    ],
)
def test_precision_units_come_from_the_compute_capability(
    cc: tuple[int, int], units: set[str]
) -> None:
    assert precision_units(gpu("x", 1024, 1, cc)) == units


def test_a_name_that_claims_fp8_on_a_device_without_it_gets_none() -> None:
    # An L4's name on an Ampere GA10x device (cc 8.6): its units, not the name's.
    spec = detected_device(gpu("NVIDIA L4", 23034, 58, (8, 6)))
    assert "fp8" not in spec.peak_tflops
    assert "bf16" in spec.peak_tflops


def test_amd_parts_come_from_the_table_and_unknown_ones_from_their_architecture() -> None:
    mi300x = replace(gpu("AMD Instinct MI300X", 196592, 304, (9, 4)), vendor="AMD")
    spec = detected_device(mi300x)
    assert spec.name == "MI300X"
    assert spec.peak_tflops["fp8"] == 2614.9
    assert spec.memory_gib == pytest.approx(192, rel=0.01)
    other = replace(gpu("AMD Instinct MI999", 256 * 1024, 256, (9, 5)), vendor="AMD")
    estimated = detected_device(other)
    assert estimated.name == "MI999"
    assert "256 CUs, gfx 9.5" in estimated.source
    assert set(estimated.peak_tflops) == {"fp32", "bf16", "fp16", "fp8"}


@pytest.mark.parametrize(
    ("ray_type", "name"),
    [
        ("L4", "L4"),
        ("A10G", "A10G"),
        ("H100", "H100"),
        ("L40S", "L40S"),
        ("GeForce-RTX-4090", "RTX4090"),
        ("AMD-Instinct-MI300X-OAM", "MI300X"),
        ("AMD-Instinct-MI250X-MI250", "MI250"),
        ("AMD-Instinct-MI250X", "MI250X"),
        ("A100-40G", "A100-40GB"),
        ("V100", "V100M16"),
        ("Tesla V100-PCIE-32GB", "V100-PCIe"),
    ],
)
def test_a_part_is_known_by_its_driver_name_or_rays_accelerator_type(
    ray_type: str, name: str
) -> None:
    part = known_part(ray_type)
    assert part is not None
    assert part.name == name
    assert known_part("RTX-PRO-6000") is None


def test_an_unreadable_gpu_of_an_unknown_type_is_assumed_under_its_own_name() -> None:
    spec = assumed_device("RTX-PRO-6000")
    assert spec.name == "RTX-PRO-6000"
    assert spec.source.startswith("assumed: no datasheet entry matches 'RTX-PRO-6000'")
    assert spec.memory_gib == 16
    # the Turing estimate of a T4's properties is the catalog's T4
    assert dict(spec.peak_tflops) == pytest.approx(dict(CATALOG["T4"].peak_tflops), rel=0.01)
    assert spec.memory_bandwidth_gbps == CATALOG["T4"].memory_bandwidth_gbps


def test_device_answers_a_detected_gpu_once_registered_and_a_known_part_by_name() -> None:
    assert device("L4").memory_gib == 24  # the table's, with the datasheet's memory
    register_device(detected_device(L4))
    assert device("L4").memory_bytes == L4.total_memory_bytes
    with pytest.raises(KeyError, match="Foo-9000"):
        device("Foo-9000")
    register_device(detected_device(FOO))
    assert device("Foo-9000").source.startswith("estimated")


def test_the_readers_fail_cleanly_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml
    import torch

    def no_library() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvml_properties() is None
    assert torch_properties() is None


def test_the_nvml_reader_counts_sms_from_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    calls: list[str] = []
    fake: dict[str, Any] = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: f"gpu{i}",
        "nvmlDeviceGetName": lambda h: b"NVIDIA L4",
        "nvmlDeviceGetCudaComputeCapability": lambda h: (8, 9),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=23034 * MIB),
        "nvmlDeviceGetNumGpuCores": lambda h: 7424,
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: 2040,
    }
    for name, value in fake.items():
        monkeypatch.setattr(pynvml, name, value)
    assert nvml_properties() == L4  # 7424 cores / 128 per Ada SM = 58 SMs
    assert calls == ["init", "shutdown"]
    assert nvml_properties(1) is None  # no such GPU


def test_the_torch_reader_takes_the_device_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    props = SimpleNamespace(
        name="NVIDIA A10G",
        total_memory=23028 * MIB,
        multi_processor_count=80,
        major=8,
        minor=6,
        clock_rate=1710000,  # kHz
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "hip", None)
    assert torch_properties() == A10G
    assert torch_properties(1) is None


def test_an_explanation_says_where_its_devices_figures_come_from() -> None:
    spec = detected_device(L4)
    register_device(spec)
    node = devices.node_info("l4-box", gpu_model="L4", gpu_count=4, cpu_milli=0, memory_mib=0)
    job = JobSpec(job_id="j", model=MODEL_CATALOG["gpt-125m"], global_batch=32, max_gpus=2)
    placement = Placement(
        job_id="j", ranks=tuple(RankSlot(rank=i, node_id="l4-box", gpu_index=i) for i in (0, 1))
    )
    explanation = explain_decision(
        spec=job,
        config=JobConfig(layout=Layout(world_size=2, dp=2)),
        placement=placement,
        nodes={"l4-box": node},
        features={},
        why="test",
    )
    assert explanation["chosen"]["devices"] == {"L4": spec.source}
    assert explanation["chosen"]["devices"]["L4"].startswith("table of known parts: NVIDIA L4")
    assert explanation["chosen"]["predicted_goodput"] > 0
