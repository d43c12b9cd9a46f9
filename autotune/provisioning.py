"""Provisioning: keep powered only the nodes that the forecast demand needs.

Every round the ``Provisioner`` records the cluster's GPU demand (GPUs held plus GPUs
pending jobs ask for), asks its ``DemandForecaster`` for the ``level`` quantile of the
peak demand over the next ``horizon_min`` minutes, and aims for that many powered GPUs
(never fewer than the demand now, plus ``spare_gpus``):

- below the target it **wakes** parked nodes (each usable after the backend's wake-up
  latency), in node order;
- above it by at least a node it **parks** idle nodes (no job holds a GPU there), last
  nodes first, so jobs stay packed on the first ones.

Without a forecaster (``mode="none"``) every node stays on. What parking means is the
backend's: the simulator powers the node down (``SimConfig.parked_power_fraction``);
where nodes cannot be powered down (Ray) the plan is a recommendation. Unlike the
Helios CES simulation, the forecast sees nothing after the moment it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from autotune.demand import DemandForecaster, DemandHistory
from autotune.interfaces import ClusterSnapshot

__all__ = ["PROVISIONING", "Provisioner", "ProvisioningPlan"]

PROVISIONING: Final = ("none", "buffer", "forecast")
"""``none``: every node on; ``buffer``: the target from persistence + buffer;
``forecast``: from the LSTM's quantile."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvisioningPlan:
    park: tuple[str, ...] = ()
    wake: tuple[str, ...] = ()
    target_gpus: float
    """GPUs the plan keeps powered or waking (at least)."""
    powered_gpus: float
    """GPUs powered or waking after the plan."""
    predictor: str
    reason: str


class Provisioner:
    """See the module docstring."""

    def __init__(
        self,
        forecaster: DemandForecaster | None,
        *,
        horizon_min: int = 60,
        level: float = 0.95,
        spare_gpus: float = 0.0,
    ) -> None:
        if spare_gpus < 0:
            raise ValueError(f"spare_gpus={spare_gpus!r}: must be >= 0")
        self.forecaster = forecaster
        self.horizon_min = horizon_min
        self.level = level
        self.spare_gpus = spare_gpus
        self.history = DemandHistory()

    def reset(self) -> None:
        self.history.clear()

    def plan(self, snapshot: ClusterSnapshot) -> ProvisioningPlan:
        demand = snapshot.demand_gpus()
        self.history.record(snapshot.time_s, demand)
        parked = [n for n in snapshot.parked_nodes if n.gpu_count > 0]
        powered = [n for n in (*snapshot.nodes, *snapshot.waking_nodes) if n.gpu_count > 0]
        on = float(sum(n.gpu_count for n in powered))
        if self.forecaster is None:
            return ProvisioningPlan(
                wake=tuple(n.node_id for n in parked),
                target_gpus=on + sum(n.gpu_count for n in parked),
                powered_gpus=on + sum(n.gpu_count for n in parked),
                predictor="none",
                reason="provisioning off: every node on",
            )
        forecast = self.history.forecast(self.forecaster, snapshot.capacity_gpus())
        peak = forecast.quantile(self.horizon_min, self.level)
        target = max(peak, demand) + self.spare_gpus
        why = (
            f"{self.level:.0%} quantile of the next {self.horizon_min} min peak "
            f"{peak:.1f} GPUs ({forecast.predictor}), demand now {demand:.1f}"
        )
        woken: list[str] = []
        park: list[str] = []
        if on < target:
            for node in parked:
                if on >= target:
                    break
                woken.append(node.node_id)
                on += node.gpu_count
        else:
            held = snapshot.held_gpus()
            for node in reversed([n for n in snapshot.nodes if n.gpu_count > 0]):
                if held.get(node.node_id, 0.0) > 0 or on - node.gpu_count < target:
                    continue
                park.append(node.node_id)
                on -= node.gpu_count
        return ProvisioningPlan(
            park=tuple(park),
            wake=tuple(woken),
            target_gpus=target,
            powered_gpus=on,
            predictor=forecast.predictor,
            reason=why,
        )
