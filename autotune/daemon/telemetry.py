"""Telemetry sources: live figures of the machines the daemon can see.

Chosen at start-up (``host_sources``), in this order:

- **NVML** (``nvidia-ml-py``) where NVIDIA GPUs exist: per GPU utilisation, memory,
  power, temperature, PCIe and NVLink throughput. Missing NVML (a CPU machine) is
  normal: the source is simply not chosen.
- **psutil** on a machine without GPUs: CPU utilisation, memory, load average.
- **Ray's state API** when the daemon is attached to a Ray cluster (``ray_address``):
  nodes, total and available resources, live actors.

The cluster the daemon schedules (the simulator or Ray) reports its own figures in its
snapshots; these sources describe the real hardware beside it. Reads are cached for
``min_interval_s`` so a busy API does not hammer the drivers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from autotune.daemon.log import event

__all__ = [
    "CachedSource",
    "NvmlTelemetry",
    "PsutilTelemetry",
    "RayStateTelemetry",
    "TelemetrySource",
    "host_sources",
]


@runtime_checkable
class TelemetrySource(Protocol):
    name: str

    def read(self) -> dict[str, Any]:
        """The latest figures, JSON-ready."""
        ...


def _maybe(read: Callable[..., Any], *args: Any) -> Any:
    """A figure the device may not offer (power on some boards, NVLink on PCIe cards)."""
    try:
        return read(*args)
    except Exception:
        return None


class NvmlTelemetry:
    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    @classmethod
    def available(cls) -> NvmlTelemetry | None:
        """The source, or ``None`` where there is no NVIDIA driver or no GPU."""
        try:
            source = cls()
        except Exception as exc:  # no libnvidia-ml, no driver: a CPU machine
            event("telemetry.nvml_absent", level=logging.DEBUG, reason=str(exc))
            return None
        return source if source._handles else None

    def read(self) -> dict[str, Any]:
        return {"gpus": [self._gpu(i, h) for i, h in enumerate(self._handles)]}

    def _gpu(self, index: int, handle: Any) -> dict[str, Any]:
        nvml = self._nvml
        memory = _maybe(nvml.nvmlDeviceGetMemoryInfo, handle)
        utilization = _maybe(nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _maybe(nvml.nvmlDeviceGetPowerUsage, handle)
        nvlink = _maybe(
            nvml.nvmlDeviceGetFieldValues,
            handle,
            [
                nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            ],
        )
        return {
            "index": index,
            "name": _maybe(nvml.nvmlDeviceGetName, handle),
            "utilization_pct": None if utilization is None else utilization.gpu,
            "memory_used_bytes": None if memory is None else int(memory.used),
            "memory_total_bytes": None if memory is None else int(memory.total),
            "power_watts": None if power_mw is None else power_mw / 1000,
            "temperature_c": _maybe(
                nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "pcie_tx_kib_s": _maybe(
                nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES
            ),
            "pcie_rx_kib_s": _maybe(
                nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES
            ),
            # Cumulative KiB sent/received over all links (rates are differences).
            "nvlink_tx_kib": _nvlink_value(nvlink, 0),
            "nvlink_rx_kib": _nvlink_value(nvlink, 1),
        }


def _nvlink_value(values: Any, i: int) -> int | None:
    if values is None:
        return None
    field = values[i]
    if field.nvmlReturn != 0:  # NVML_SUCCESS
        return None
    return int(field.value.ullVal)


class PsutilTelemetry:
    name = "psutil"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    def read(self) -> dict[str, Any]:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        return {
            "cpu_utilization_pct": psutil.cpu_percent(interval=None),
            "cpu_count": psutil.cpu_count(),
            "memory_used_bytes": int(memory.total - memory.available),
            "memory_total_bytes": int(memory.total),
            "load_average_1m": psutil.getloadavg()[0],
        }


class RayStateTelemetry:
    """Nodes, resources and actors of the Ray cluster at ``address`` (``ray.init`` is
    called lazily, at the first read)."""

    name = "ray"

    def __init__(self, address: str) -> None:
        self.address = address
        self._connected = False

    def read(self) -> dict[str, Any]:
        import ray
        from ray.util.state import list_actors

        if not self._connected:
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False)
            self._connected = True
        nodes = [
            {
                "node_id": node["NodeID"],
                "alive": bool(node["Alive"]),
                "address": node.get("NodeManagerAddress"),
                "resources": node.get("Resources", {}),
            }
            for node in ray.nodes()  # type: ignore[no-untyped-call]
        ]
        figures: dict[str, Any] = {
            "nodes": nodes,
            "resources_total": ray.cluster_resources(),  # type: ignore[no-untyped-call]
            "resources_available": ray.available_resources(),  # type: ignore[no-untyped-call]
            "actors_alive": None,
        }
        try:  # actors come from the dashboard's state server (ray[default])
            actors = list_actors(
                address=self.address,
                filters=[("state", "=", "ALIVE")],
                raise_on_missing_output=False,
            )
            figures["actors_alive"] = len(actors)
        except Exception as exc:
            figures["actors_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return figures


class CachedSource:
    """A source whose reads are reused for ``min_interval_s``; a failing read is
    reported in the figures instead of failing the request."""

    def __init__(self, source: TelemetrySource, min_interval_s: float = 1.0) -> None:
        self.name = source.name
        self._source = source
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._value: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self._min_interval_s:
                try:
                    self._value = self._source.read()
                except Exception as exc:
                    self._value = {"error": f"{type(exc).__name__}: {exc}"}
                self._at = now
            return self._value


def host_sources(ray_address: str | None = None) -> list[TelemetrySource]:
    """NVML where GPUs exist, else psutil; plus Ray's state API when attached."""
    sources: list[TelemetrySource] = []
    nvml = NvmlTelemetry.available()
    sources.append(CachedSource(nvml if nvml is not None else PsutilTelemetry()))
    if ray_address:
        sources.append(CachedSource(RayStateTelemetry(ray_address), min_interval_s=5.0))
    return sources
