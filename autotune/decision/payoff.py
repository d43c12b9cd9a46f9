"""A reconfiguration pays for itself, or the running job keeps its configuration.

Changing a running job's configuration restarts it: its state is gathered, its ranks
torn down, the new layout started and restored. Where the backend measures what that
costs (``ClusterSnapshot.restart_s``: the Ray backend does), the decision step takes a
policy's new configuration for a running job only when both hold:

1. **The change pays for itself.** Over the job's remaining work, the time saved is more
   than ``RESTART_MARGIN`` times the restart::

       remaining   = (1 - progress) x steps x global batch            [samples]
       goodput(c)  = samples/s(c) x statistical efficiency(c)         [samples/s]
       (the batch's efficiency from the noise scale the job measured, where it did:
       ``JobStatus.profile``; the compression's from the task's calibration where
       it measured one, else the catalog's; the precision's from the catalog)
       samples/s   = measured under the current configuration (the last step's: a job
                     with no measured step is not changed); under the new one, that
                     times the performance model's ratio new / current (the job's
                     online fit where it has one, else the catalog's)
       saved       = remaining / goodput(current) - remaining / goodput(new)   [s]
       pays        = saved > RESTART_MARGIN x restart_s

2. **The last change showed a gain.** A job changed before is changed again only once
   its last change is measured (``ConfigChange.samples_per_s_after``) and its goodput
   (measured throughput times the model's statistical efficiency) rose; going back to the
   configuration it ran before the change is always allowed (its throughput there was
   measured). So no job is reconfigured twice in a row without a measured gain.

A change that fails either is declined with the arithmetic in its reason; one that passes
carries it in its decision's explanation (``reconfiguration``). Overrides are the user's
word and are not weighed; nor is a preemption (not a reconfiguration).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from autotune.catalog.applications import catalog_coefficients
from autotune.core import JobConfig, NodeInfo
from autotune.interfaces import JobStatus
from autotune.perf.model import Shape, estimate, shape_of, statistical_efficiency
from autotune.perf.online import JobModel

__all__ = ["RESTART_MARGIN", "Payoff", "payoff", "unproven_change"]

RESTART_MARGIN: Final = 1.5
"""A change must be predicted to save this many times the restart it costs: the
performance model's error on this job's own steps is often tens of percent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Payoff:
    """The arithmetic of one change of a running job (see the module's docstring)."""

    remaining_samples: float
    current_s: float
    """Predicted seconds to finish under the current configuration."""
    new_s: float
    """Predicted seconds to finish under the new one (restart excluded)."""
    restart_s: float
    measured_samples_per_s: float
    """The current configuration's measured throughput the prediction starts from."""
    margin: float = RESTART_MARGIN

    @property
    def saved_s(self) -> float:
        return self.current_s - self.new_s

    @property
    def pays(self) -> bool:
        return self.saved_s > self.margin * self.restart_s

    def describe(self) -> str:
        return (
            f"over its remaining {self.remaining_samples:,.0f} samples the change is "
            f"predicted to save {self.saved_s:.1f} s ({self.current_s:.1f} s -> "
            f"{self.new_s:.1f} s), against a restart of {self.restart_s:.1f} s x "
            f"{self.margin:g} = {self.margin * self.restart_s:.1f} s"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "remaining_samples": round(self.remaining_samples, 1),
            "measured_samples_per_s": self.measured_samples_per_s,
            "current_s": round(self.current_s, 3),
            "new_s": round(self.new_s, 3),
            "saved_s": round(self.saved_s, 3),
            "restart_s": round(self.restart_s, 3),
            "margin": self.margin,
            "pays": self.pays,
        }


def _resized(shape: Shape, world: int) -> Shape:
    """``shape`` with ``world`` ranks spread evenly over as many of its nodes as they fill;
    a shape across GPU models, on its slowest one (where its ranks would go is not
    known)."""
    nodes = max(1, min(shape.nodes, world))
    per = [world // nodes + (1 if i < world % nodes else 0) for i in range(nodes)]
    return replace(shape, ranks_per_node=tuple(per), gpu_models=(), balanced=False)


def payoff(
    job: JobStatus,
    new: JobConfig,
    nodes: Mapping[str, NodeInfo],
    restart_s: float,
    model: JobModel | None = None,
    *,
    balanced: bool = False,
) -> Payoff | str:
    """The arithmetic of changing running ``job`` to ``new``, or why it cannot be done
    (then the change is not predicted to pay). ``balanced``: ranks on several GPU models
    take batch shares by speed (``ClusterSnapshot.mixes_models``)."""
    spec, current, placement = job.spec, job.config, job.placement
    if current is None or placement is None:
        raise ValueError(f"job {spec.job_id}: not running, nothing to change")
    profile = job.profile
    if spec.model is None or profile is None:
        return "its model has no profile, so no gain can be predicted"
    if job.steps is None:
        return "its length is unknown, so no gain over its remaining work can be predicted"
    if any(slot.node_id not in nodes for slot in placement.ranks):
        return "a node it runs on is gone"
    shape = shape_of(placement, nodes, balanced=balanced)
    coeffs = (
        model.coefficients
        if model is not None
        else catalog_coefficients(spec.model, shape.gpu_model)
    )
    now = estimate(profile, current, shape, current.batch(spec), coeffs=coeffs)
    then = estimate(profile, new, _resized(shape, new.world_size), new.batch(spec), coeffs=coeffs)
    measured = job.metrics.samples_per_s or job.samples_per_s or None
    if measured is None:
        return "its current configuration has no measured step yet, so no gain can be told"
    scale = measured / now.step.samples_per_s if now.step.samples_per_s > 0 else 1.0
    goodput_now, goodput_then = now.goodput * scale, then.goodput * scale
    if goodput_now <= 0 or goodput_then <= 0:
        return "the performance model predicts no progress under one of the configurations"
    remaining = max(0.0, 1.0 - job.progress) * job.steps * spec.global_batch
    return Payoff(
        remaining_samples=remaining,
        current_s=remaining / goodput_now,
        new_s=remaining / goodput_then,
        restart_s=restart_s,
        measured_samples_per_s=round(measured, 3),
    )


def unproven_change(job: JobStatus, new: JobConfig) -> str | None:
    """Why ``job`` may not change to ``new`` yet: its last change is not measured, or
    measured no gain (``None``: it may; see rule 2 of the module's docstring)."""
    change, current = job.last_change, job.config
    if change is None or current is None or new == change.previous:
        return None
    if change.samples_per_s_after is None:
        return (
            f"its last change (from {change.previous.describe()}) is not measured yet: "
            "it is not changed again before that change shows a gain"
        )
    if change.samples_per_s_before is None:
        return None
    model = job.profile
    before = change.samples_per_s_before * statistical_efficiency(
        model, change.previous, change.previous.batch(job.spec)
    )
    after = change.samples_per_s_after * statistical_efficiency(
        model, current, current.batch(job.spec)
    )
    if after > before and math.isfinite(after):
        return None
    return (
        f"its last change (from {change.previous.describe()}) measured no gain: goodput "
        f"{before:.1f} -> {after:.1f} samples/s (measured throughput x modelled efficiency); "
        "it may only go back"
    )
