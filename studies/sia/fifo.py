"""First come, first served on the fastest GPU type with room: the baseline that both
Sia's simulator (``bench/sia_fifo_anchor.py`` runs it there) and the Sia-compatible world
run, to check the world against Sia's own.

Every round:

1. a running job keeps its GPUs (no preemption, no move);
2. the waiting jobs, in arrival order, each try the GPU types from the fastest for the
   job to the slowest (its samples per second on its GPUs packed on the type's nodes,
   as Sia's ``Application.get_throughput_with_accum`` ranks them; ties by Sia's type
   name), and take the first with as many free GPUs as the job asks, where filling the
   nodes with the most free GPUs first stays within the nodes Sia measured of that type
   (``MAX_NODES``); a job no type takes waits and later ones may start (backfill).

The decision step's Planner places each started job on nodes of the chosen model
(``PolicyChoice.gpu_models``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from autotune import __version__
from autotune.core import JobConfig, Layout
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.studies.pollux.trace import packed
from autotune.studies.sia.trace import SIA_TYPE_OF, SiaApp

__all__ = ["MAX_NODES", "SiaFifoPolicy"]

MAX_NODES: Final[Mapping[str, int]] = {"T4": 16, "RTX2080Ti": 3, "A100M40": 2}
"""``simulator_config.cluster_max_physical_nnodes`` of the three types: the most nodes
of a type one job may span."""


def listed_samples_per_s(
    app: SiaApp, gpu_model: str, gpus: int, per_node: int, batch: int
) -> float:
    """What Sia's ``Application.get_throughput_with_accum`` says of ``batch`` on ``gpus``
    packed GPUs of the model: the asked batch over the step with accumulation, split
    without the bound at the GPU count (``SiaTypeApp.split_on(capped=False)``) and
    without the slowdown. What the types are ranked by; 0 where nothing was measured."""
    on = app.on(gpu_model)
    ranks = packed(gpus, per_node)
    try:
        split = on.split_on(ranks, batch, capped=False)
        step, sync = on.step_times(ranks, split.atomic)
    except ValueError:
        return 0.0
    return batch / (step + (step - sync) * split.accum_steps)


class SiaFifoPolicy:
    """See the module docstring; ``apps``: Sia's applications (``load_sia_apps``)."""

    name = "sia-fifo"

    def __init__(self, apps: Mapping[str, SiaApp]) -> None:
        self.apps = apps
        self.version = f"sia-fifo-{__version__}"

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        free: dict[str, dict[str, int]] = {}  # model -> node -> free GPUs
        per_node: dict[str, int] = {}
        for node in snapshot.nodes:
            if node.gpu_count > 0:
                free.setdefault(node.gpu_model, {})[node.node_id] = node.gpu_count
                per_node[node.gpu_model] = max(per_node.get(node.gpu_model, 0), node.gpu_count)
        model_of = {n.node_id: n.gpu_model for n in snapshot.nodes}
        for job in snapshot.by_state("running"):
            if job.placement is not None:
                for slot in job.placement.ranks:
                    free[model_of[slot.node_id]][slot.node_id] -= math.ceil(slot.gpu_milli / 1000)
        choices: dict[str, PolicyChoice] = {}
        for job in snapshot.jobs:  # in arrival order
            if job.state != "pending":
                continue
            spec = job.spec
            gpus = spec.requested_gpus or spec.min_gpus
            app = self.apps.get(spec.model.name) if spec.model is not None else None
            if app is None:
                choices[spec.job_id] = PolicyChoice(
                    config=None, reason="waiting: not one of Sia's applications"
                )
                continue
            speeds = {
                model: listed_samples_per_s(app, model, gpus, per_node[model], spec.global_batch)
                for model in free
                if model in app.types and spec.allows(model)
            }
            ranked = sorted(
                (m for m in speeds if speeds[m] > 0),
                key=lambda m: (-speeds[m], SIA_TYPE_OF.get(m, m)),
            )
            taken = next((m for m in ranked if _take(free[m], gpus, MAX_NODES.get(m))), None)
            if taken is None:
                choices[spec.job_id] = PolicyChoice(
                    config=None,
                    reason=f"waiting: no GPU type has {gpus} free GPUs (first come, first served)",
                )
                continue
            choices[spec.job_id] = PolicyChoice(
                config=JobConfig(layout=Layout(world_size=gpus)),
                reason=f"first come, first served on the fastest type with room: {gpus} "
                f"{taken} ({speeds[taken]:.1f} samples/s listed)",
                gpu_models=(taken,),
            )
        return PolicyRound(choices=choices)


def _take(free: dict[str, int], gpus: int, max_nodes: int | None) -> bool:
    """Take ``gpus`` GPUs from the nodes with the most free first (ties: the first node),
    within ``max_nodes`` nodes; ``False`` (``free`` unchanged) where they do not fit."""
    if sum(free.values()) < gpus:
        return False
    order = sorted(free, key=lambda n: -free[n])  # stable: node order on ties
    took: dict[str, int] = {}
    need = gpus
    for node in order:
        if need == 0:
            break
        take = min(free[node], need)
        if take > 0:
            took[node] = take
            need -= take
    if need or (max_nodes is not None and len(took) > max_nodes):
        return False
    for node, take in took.items():
        free[node] -= take
    return True
