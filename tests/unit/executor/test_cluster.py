"""A Ray node's GPUs as the Planner sees them (``autotune.executor.cluster``): the catalog
by Ray's accelerator type, else the node's own properties (read once per node), else the
table of known parts by the accelerator type, else an entry assumed under Ray's name;
never an A100 the node does not have. No Ray is started: the property reader is faked."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from helpers import MIB
from helpers import gpu_properties as gpu

from autotune.catalog import devices
from autotune.catalog.detect import GpuProperties
from autotune.catalog.devices import CATALOG, GIB, device
from autotune.executor import cluster

PROPERTIES = {
    "l4": gpu("NVIDIA L4", 23034, 58, (8, 9), 2040),
    "a10g": gpu("NVIDIA A10G", 23028, 80, (8, 6), 1710),
    "rtx": gpu("NVIDIA GeForce RTX 4090", 24564, 128, (8, 9), 2520),
    "pcie": gpu("NVIDIA H100 PCIe", 81559, 114, (9, 0), 1755),
    "foo": gpu("NVIDIA Foo 9000", 96 * 1024, 120, (10, 0), 1800),
}
# Ray's accelerator type for each node's GPUs, as Ray derives it from the driver's name
# (``NVIDIA H100 PCIe`` -> ``H100``, ``NVIDIA GeForce RTX 4090`` -> ``GeForce-RTX-4090``).
TYPES = {
    "l4": "L4",
    "a10g": "A10G",
    "rtx": "GeForce-RTX-4090",
    "pcie": "H100",
    "foo": "Foo-9000",
    "t4": "T4",
}


def entry(node_id: str, gpus: int = 4) -> dict[str, Any]:
    resources: dict[str, float] = {"CPU": 16.0, "memory": 64.0 * GIB, "GPU": float(gpus)}
    if node_id in TYPES:
        resources[f"accelerator_type:{TYPES[node_id]}"] = 1.0
    return {
        "NodeID": node_id,
        "NodeManagerHostname": f"{node_id}-box",
        "Alive": True,
        "Resources": resources,
    }


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The nodes whose properties were read, call by call (from ``PROPERTIES``)."""
    monkeypatch.setattr(cluster, "_models", {})
    monkeypatch.setattr(cluster, "_named", {})
    monkeypatch.setattr(cluster, "_seen", {})
    monkeypatch.setattr(devices, "_REGISTERED", {})
    calls: list[list[str]] = []

    def fake(ray_ids: list[str]) -> dict[str, GpuProperties | None]:
        calls.append(list(ray_ids))
        return {ray_id: PROPERTIES.get(ray_id) for ray_id in ray_ids}

    monkeypatch.setattr(cluster, "_node_properties", fake)
    return calls


@pytest.mark.parametrize(
    ("node", "model", "units"),
    [
        ("l4", "L4", {"fp32", "bf16", "fp16", "fp8"}),
        ("a10g", "A10G", {"fp32", "bf16", "fp16"}),
        ("rtx", "RTX4090", {"fp32", "bf16", "fp16", "fp8"}),
        ("pcie", "H100-PCIe", {"fp32", "bf16", "fp16", "fp8"}),
        ("foo", "Foo-9000", {"fp32", "bf16", "fp16", "fp8"}),
    ],
)
def test_a_gpu_the_catalog_does_not_name_is_recognised_from_its_properties(
    read: list[list[str]], node: str, model: str, units: set[str]
) -> None:
    info = cluster._info(f"{node}-box", entry(node))
    assert info.gpu_model == model
    assert info.gpu_count == 4
    assert info.gpu_memory_bytes == PROPERTIES[node].total_memory_bytes
    assert set(info.peak_tflops) == units
    assert info.peak_tflops != dict(CATALOG["A100"].peak_tflops)
    assert device(model).memory_bytes == PROPERTIES[node].total_memory_bytes  # registered
    assert read == [[node]]
    cluster._info(f"{node}-box", entry(node))
    assert read == [[node]]  # once per node


def test_a_catalog_accelerator_type_of_one_part_needs_no_reading(read: list[list[str]]) -> None:
    info = cluster._info("t4-box", entry("t4", gpus=8))
    assert info.gpu_model == "T4"
    assert info.gpu_memory_bytes == CATALOG["T4"].memory_bytes
    assert read == []
    cpu = cluster._info("cpu-box", entry("cpu", gpus=0))
    assert (cpu.gpu_model, cpu.gpu_count) == ("CPU", 16)


def test_unreadable_properties_fall_back_to_the_table_then_to_an_assumed_entry(
    read: list[list[str]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unreadable(ray_ids: list[str]) -> dict[str, GpuProperties | None]:
        read.append(list(ray_ids))
        return dict.fromkeys(ray_ids)

    monkeypatch.setattr(cluster, "_node_properties", unreadable)
    with caplog.at_level(logging.INFO, logger=cluster.__name__):
        models = cluster._gpu_models([entry(n) for n in ("l4", "rtx", "pcie", "foo", "t4")])
    assert read == [["l4", "rtx", "pcie", "foo"]]  # all at once; the catalog's T4 not at all
    assert models == {"l4": "L4", "rtx": "RTX4090", "pcie": "H100", "foo": "Foo-9000", "t4": "T4"}
    assert device("L4").memory_gib == 24  # the datasheet's: the node did not say
    assert device("L4").source.startswith("table of known parts: NVIDIA L4 datasheet")
    foo = device("Foo-9000")
    assert foo.source.startswith("assumed: no datasheet entry matches 'Foo-9000'")
    assert foo.memory_gib == 16
    assert "A100" not in models.values()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "GPU Foo-9000" in warnings[0]


def test_a_node_without_an_accelerator_type_is_still_recognised(
    read: list[list[str]],
) -> None:
    bare = entry("l4")
    del bare["Resources"]["accelerator_type:L4"]
    assert cluster._info("l4-box", bare).gpu_model == "L4"
    unknown = entry("nothing")  # neither properties nor a type
    info = cluster._info("nothing-box", unknown)
    assert info.gpu_model == "GPU"
    assert device("GPU").source.startswith("assumed")


def test_the_cluster_reports_each_nodes_own_gpus(
    read: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    entries = [entry(n) for n in ("l4", "a10g", "rtx", "pcie", "foo", "t4")]
    monkeypatch.setattr(ray, "nodes", lambda: entries)
    nodes = {n.node_id: n for n in cluster.ray_cluster().alive}
    assert {name: n.gpu_model for name, n in nodes.items()} == {
        "l4-box": "L4",
        "a10g-box": "A10G",
        "rtx-box": "RTX4090",
        "pcie-box": "H100-PCIe",  # Ray's "H100" names several parts: the node tells
        "foo-box": "Foo-9000",
        "t4-box": "T4",
    }
    assert read == [["l4", "a10g", "rtx", "pcie", "foo"]]
    assert nodes["pcie-box"].intra_node_bandwidth_gbps == 63.0  # PCIe 5.0, not NVLink
    assert nodes["a10g-box"].gpu_memory_bytes == 23028 * MIB
    assert "fp8" not in nodes["a10g-box"].peak_tflops
    cluster.ray_cluster()
    assert len(read) == 1
