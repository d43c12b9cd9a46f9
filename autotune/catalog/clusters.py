"""A user's cluster, described in a file: its nodes, and the links between them as
measured.

``autotune cluster describe --ray-address ADDR`` writes one from a running Ray cluster
(the nodes as the Ray backend sees them, and each machine's link to the first one
measured by an all-reduce: ``autotune.executor.links``); a user may also write one by
hand. The file is JSON::

    {"nodes": [{"node_id": "box-1", "gpu_model": "A100", "gpu_count": 8,
                "cpu_milli": 64000, "memory_mib": 524288,
                "inter_node_bandwidth_gbps": 12.5}, ...],
     "links": [{"a": "box-0", "b": "box-1", "gbps": 11.8, "latency_s": 4e-05,
                "bytes": 16777216}],
     "source": "ray://10.0.0.1:6379", "described_at": "2026-12-03T18:00:00+00:00"}

A node written in short (as above) takes its GPU figures from the catalog
(``autotune.catalog.devices.node_info``); a node written in full (every ``NodeInfo``
field, as ``describe`` writes them) is taken as it is. A node's
``inter_node_bandwidth_gbps`` is what the performance model charges its all-reduces:
``describe`` sets it to the slowest link measured from the node.

``autotune calibrate --cluster-file FILE`` adds a ``"calibration"``: its report (the
configurations it measured on the cluster, the fit's errors), with the calibrated
``"device"`` (``{"name", "base", "peak_tflops"}``) and the performance model's
``"coefficients"`` on this cluster; the nodes of the base device then name the
calibrated one. Loading the file registers that device
(``autotune.catalog.devices.register_device``) and its coefficients as the prior of every
job on it (``autotune.catalog.applications.catalog_coefficients``), so that everything
that asks the catalog (the simulated cluster, the policy's observation, the decision
step's predictions, the daemon's online fits) sees the measured figures: a CPU's slow
bf16, say, where the catalog assumes a fast one. Where the calibration also fitted a
task's own compute (``--compute TASK``: its ``statistics[TASK]["compute"]``), that task's
jobs get the cluster's coefficients with its compute in place (``task_coefficients``).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.catalog.devices import (
    DeviceSpec,
    calibrated_device,
    device,
    node_info,
    register_device,
)
from autotune.core import NodeInfo
from autotune.errors import InputError
from autotune.perf.model import Coefficients

__all__ = [
    "ClusterDescription",
    "LinkMeasurement",
    "calibration_profile",
    "load_cluster",
    "register_calibration",
    "save_cluster",
    "task_coefficients",
]

_SHORT_FIELDS = frozenset(
    {"node_id", "gpu_model", "gpu_count", "cpu_milli", "memory_mib", "inter_node_bandwidth_gbps"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkMeasurement:
    """One link as measured: an all-reduce of ``bytes`` between a process on ``a`` and
    one on ``b``."""

    a: str
    b: str
    gbps: float
    """Bandwidth each way, GB/s: the bytes over the all-reduce's median time (a ring of
    two ranks sends each rank's whole buffer once)."""
    latency_s: float
    """The median time of an all-reduce of 4 bytes, seconds."""
    bytes: int

    def __post_init__(self) -> None:
        for name in ("gbps", "latency_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"LinkMeasurement.{name}={value!r}: must be finite and > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterDescription:
    nodes: tuple[NodeInfo, ...]
    links: tuple[LinkMeasurement, ...] = ()
    source: str = "hand-written"
    described_at: str | None = None
    calibration: Mapping[str, Any] | None = None
    """``autotune calibrate``'s report on this cluster (see the module docstring)."""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
        known = set(ids)
        for link in self.links:
            if link.a not in known or link.b not in known:
                raise ValueError(f"link {link.a}-{link.b}: not between nodes of the cluster")

    def with_measured_links(self) -> ClusterDescription:
        """The nodes with ``inter_node_bandwidth_gbps`` set to the slowest link measured
        from each (nodes without a measurement keep theirs)."""
        slowest: dict[str, float] = {}
        for link in self.links:
            for end in (link.a, link.b):
                slowest[end] = min(slowest.get(end, math.inf), link.gbps)
        nodes = tuple(
            replace(n, inter_node_bandwidth_gbps=slowest[n.node_id]) if n.node_id in slowest else n
            for n in self.nodes
        )
        return replace(self, nodes=nodes)

    def profile(self) -> tuple[DeviceSpec, Coefficients] | None:
        """The calibrated device and coefficients (registered as it is read), ``None``
        before a calibration."""
        if self.calibration is None:
            return None
        return register_calibration(self.calibration)

    @property
    def coefficients(self) -> Coefficients | None:
        """The performance model's coefficients on this cluster, if calibrated."""
        found = self.profile()
        return None if found is None else found[1]

    @property
    def task_coefficients(self) -> dict[str, Coefficients]:
        """Each task's own coefficients on this cluster, where its calibration fitted the
        task's compute (``autotune calibrate --compute TASK``): the cluster's, with the
        task's compute in place. A task not among them runs on ``coefficients``."""
        found = self.profile()
        if found is None or self.calibration is None:
            return {}
        return task_coefficients(self.calibration, found[1])

    def with_calibration(self, report: Mapping[str, Any]) -> ClusterDescription:
        """This cluster calibrated by ``report``: its nodes of the calibration's base
        device now of the calibrated one."""
        spec, _ = register_calibration(report)
        base = report["device"]["base"]
        nodes = tuple(
            replace(n, gpu_model=spec.name, peak_tflops=dict(spec.peak_tflops))
            if n.gpu_model in (base, spec.name)
            else n
            for n in self.nodes
        )
        return replace(self, nodes=nodes, calibration=copy.deepcopy(dict(report)))

    def to_json(self) -> dict[str, Any]:
        from autotune.serde import to_json

        out: dict[str, Any] = {
            "nodes": [to_json(n) for n in self.nodes],
            "links": [to_json(link) for link in self.links],
            "source": self.source,
            "described_at": self.described_at,
        }
        if self.calibration is not None:
            out["calibration"] = copy.deepcopy(dict(self.calibration))
        return out


def register_calibration(report: Mapping[str, Any]) -> tuple[DeviceSpec, Coefficients]:
    """Register a calibration's device and, as the prior of every job on that device, its
    coefficients (``autotune.catalog.applications.catalog_coefficients``), and what it
    measured of its tasks' training, the gradient noise scale and the efficiency under
    each compression (``autotune.catalog.tasks.task_profile``, where its report has
    ``statistics``); returns the device and coefficients."""
    from autotune.catalog.applications import register_coefficients
    from autotune.catalog.tasks import register_compression_efficiency, register_noise_scale

    spec, coeffs = calibration_profile(report)
    register_device(spec)
    register_coefficients(spec.name, coeffs, task_coefficients(report, coeffs))
    for task, figures in (report.get("statistics") or {}).items():
        # The scale at the end of the efficiency measurement's runs to the target, where
        # measured, over the calibration's 20-step runs' (early in training, smaller).
        noise = figures.get("run_noise_scale") or figures.get("noise_scale")
        if noise is not None:
            register_noise_scale(task, float(noise))
        if figures.get("compression_efficiency"):
            register_compression_efficiency(task, figures["compression_efficiency"])
    return spec, coeffs


def task_coefficients(report: Mapping[str, Any], coeffs: Coefficients) -> dict[str, Coefficients]:
    """The tasks whose own compute calibration ``report`` fitted (its ``statistics``,
    ``autotune.executor.calibrate.calibrate_compute``), each with the cluster's
    ``coeffs`` and its compute in place."""
    return {
        task: coeffs.fitted(figures["compute"]["coefficients"])
        for task, figures in (report.get("statistics") or {}).items()
        if figures.get("compute")
    }


def calibration_profile(report: Mapping[str, Any]) -> tuple[DeviceSpec, Coefficients]:
    """The calibrated device and coefficients of a calibration report (``autotune
    calibrate``'s: ``{"device": {"base", "peak_tflops"}, "coefficients": {...}}``)."""
    base = device(report["device"]["base"])
    spec = calibrated_device(base, report["device"]["peak_tflops"])
    return spec, Coefficients(**report["coefficients"])


def _node(entry: Any, where: str) -> NodeInfo:
    from autotune.serde import from_json

    if not isinstance(entry, dict):
        raise InputError(f"{where}: a node is an object, not {type(entry).__name__}")
    try:
        if set(entry) <= _SHORT_FIELDS:
            return node_info(**entry)
        return from_json(NodeInfo, entry)
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError(f"{where}: {exc}") from None


def load_cluster(path: str | Path) -> ClusterDescription:
    """The cluster described in ``path``; ``InputError`` saying what is wrong otherwise."""
    from autotune.serde import from_json

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such cluster file") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a JSON cluster file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise InputError(f'{path}: expected an object with a list of "nodes"')
    calibration = data.get("calibration")
    if calibration is not None:
        try:
            register_calibration(calibration)
        except (TypeError, ValueError, KeyError) as exc:
            raise InputError(f"{path}: calibration: {exc}") from None
    nodes = tuple(_node(e, f"{path}: nodes[{i}]") for i, e in enumerate(data["nodes"]))
    try:
        links = tuple(from_json(LinkMeasurement, e) for e in data.get("links") or [])
        return ClusterDescription(
            nodes=nodes,
            links=links,
            source=str(data.get("source") or "hand-written"),
            described_at=data.get("described_at"),
            calibration=calibration,
        )
    except ValueError as exc:
        raise InputError(f"{path}: {exc}") from None


def save_cluster(description: ClusterDescription, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(description.to_json(), indent=1) + "\n")
    tmp.replace(path)
