"""A cluster file: written by hand in short or by ``autotune cluster describe`` in full,
read back the same, with clear errors; its measured links set the nodes' bandwidth, and
the simulated backend simulates its nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.catalog.clusters import (
    ClusterDescription,
    LinkMeasurement,
    load_cluster,
    save_cluster,
)
from autotune.catalog.devices import node_info
from autotune.errors import InputError

SHORT = {
    "nodes": [
        {"node_id": "box-0", "gpu_model": "A100", "gpu_count": 8, "cpu_milli": 64000,
         "memory_mib": 524288},
        {"node_id": "box-1", "gpu_model": "T4", "gpu_count": 4, "cpu_milli": 32000,
         "memory_mib": 262144, "inter_node_bandwidth_gbps": 1.25},
    ]
}  # fmt: skip


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_a_hand_written_file_takes_its_gpus_from_the_catalog(tmp_path: Path) -> None:
    cluster = load_cluster(_write(tmp_path / "c.json", SHORT))
    a100, t4 = cluster.nodes
    assert a100 == node_info("box-0", gpu_model="A100", gpu_count=8, cpu_milli=64000,
                             memory_mib=524288)  # fmt: skip
    assert t4.gpu_model == "T4"
    assert t4.inter_node_bandwidth_gbps == 1.25
    assert cluster.source == "hand-written"
    assert cluster.links == ()


def test_a_described_cluster_round_trips_and_its_links_set_the_bandwidth(
    tmp_path: Path,
) -> None:
    nodes = load_cluster(_write(tmp_path / "c.json", SHORT)).nodes
    links = (LinkMeasurement(a="box-0", b="box-1", gbps=0.0125, latency_s=2e-4, bytes=1 << 24),)
    described = ClusterDescription(
        nodes=nodes, links=links, source="ray://x:1"
    ).with_measured_links()
    assert [n.inter_node_bandwidth_gbps for n in described.nodes] == [0.0125, 0.0125]
    save_cluster(described, tmp_path / "out" / "cluster.json")
    assert load_cluster(tmp_path / "out" / "cluster.json") == described


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{", "not a JSON cluster file"),
        ({"nodes": {}}, 'list of "nodes"'),
        ({"nodes": [SHORT["nodes"][0], SHORT["nodes"][0]]}, "node ids repeat"),
        ({"nodes": [{**SHORT["nodes"][0], "gpu_model": "Z9"}]}, "nodes[0]"),
        ({"nodes": SHORT["nodes"], "links": [{"a": "box-0", "b": "elsewhere", "gbps": 1.0,
          "latency_s": 1e-4, "bytes": 1}]}, "not between nodes"),
    ],
)  # fmt: skip
def test_a_bad_cluster_file_is_refused_saying_why(
    tmp_path: Path, content: object, says: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(InputError, match=says.replace("[", r"\[").replace("]", r"\]")):
        load_cluster(path)
    with pytest.raises(InputError, match="no such cluster file"):
        load_cluster(tmp_path / "missing.json")


def test_the_simulated_backend_simulates_the_files_nodes(tmp_path: Path) -> None:
    from autotune.daemon.backends import build_backend
    from autotune.daemon.settings import load_settings

    path = _write(tmp_path / "c.json", SHORT)
    backend = build_backend(load_settings(data_dir=tmp_path, cluster_file=path))
    snapshot = backend.observe()
    assert sorted(n.node_id for n in snapshot.nodes) == ["box-0", "box-1"]
