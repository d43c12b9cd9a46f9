"""The Sia-compatible world: Sia's cluster, clock, physics and jobs around the simulated
cluster the daemon runs.

What makes it Sia's (the artifact's ``sia-simulator/``):

- the cluster: ``sia_nodes`` (6 nodes of 4 T4, 3 of 8 RTX 2080 Ti, 2 of 8 A100 40 GB:
  64 GPUs of three types, ``SIA_CLUSTER``);
- the clock: a scheduling round every ``round_s`` (``--interval``: 60 s by default) after
  the jobs have advanced, and each application's ``rescale_time`` without progress at
  every start, restart and move (``SiaApp.restart_s``);
- the physics: each job advances on its application's traces for the GPU type it runs
  on (``SiaApp``), with no noise;
- the jobs: a workload CSV of Sia's (``name,time,application,num_replicas,batch_size``:
  Pollux's format) at its own times, each on its ``num_replicas`` GPUs with its batch
  size (rigid: what Sia runs its Gavel baseline with, batch-size tuning off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from autotune.catalog.devices import node_info
from autotune.core import NodeInfo
from autotune.demand import DemandForecaster
from autotune.envs.cluster_env import ClusterEnv, EnvConfig
from autotune.envs.simulator import Arrival
from autotune.envs.traces import pollux_workload
from autotune.envs.workloads import MAX_GPUS, jobs_from_trace
from autotune.errors import InputError
from autotune.studies.sia.trace import SIA_CLUSTER, SIA_GPU_MODELS, load_sia_apps

__all__ = ["ROUND_S", "sia_arrivals", "sia_env", "sia_nodes"]

ROUND_S: Final = 60.0
"""Sia's simulator's default scheduling interval (``multi_simulator.py --interval``)."""

_NODE_CPU_MILLI: Final = {"T4": 48_000, "RTX2080Ti": 64_000, "A100M40": 256_000}
_NODE_MEMORY_MIB: Final = {"T4": 192 * 1024, "RTX2080Ti": 384 * 1024, "A100M40": 1024 * 1024}
"""Host CPUs and memory of Sia's machines (g4dn.12xlarge; an 8-GPU workstation; DGX
A100): what the Planner checks a rank's CPU and memory against, never binding here."""


_LARGEST_TYPE: Final = max(count * per_node for count, per_node in SIA_CLUSTER.values())


def sia_nodes() -> list[NodeInfo]:
    """Sia's default cluster, ``SIA_CLUSTER``, its nodes named ``<type>-<i>``."""
    return [
        node_info(
            f"{suffix}-{i}",
            gpu_model=SIA_GPU_MODELS[suffix],
            gpu_count=per_node,
            cpu_milli=_NODE_CPU_MILLI[SIA_GPU_MODELS[suffix]],
            memory_mib=_NODE_MEMORY_MIB[SIA_GPU_MODELS[suffix]],
        )
        for suffix, (count, per_node) in SIA_CLUSTER.items()
        for i in range(count)
    ]


def sia_arrivals(workload: str | Path, sia: str | Path, *, elastic: bool = False) -> list[Arrival]:
    """The jobs of a Sia workload CSV at its own times (Sia's clock: its rounds start at
    0), each asking for its ``num_replicas`` GPUs with its batch size, on its
    application's physics per GPU type (``sia``: the artifact's ``sia-simulator``
    folder): rigid, or ``elastic`` (1 GPU up to the largest validated batch over the
    smallest local batch measured, at most ``MAX_GPUS``, as Sia runs them: its jobs
    have no fixed size). ``InputError`` for an application Sia did not measure."""
    apps = load_sia_apps(sia)
    out: list[Arrival] = []
    for arrival in jobs_from_trace(pollux_workload(workload, rebase=False)):
        model = arrival.spec.model
        if model is None or model.name not in apps:
            raise InputError(
                f"job {arrival.spec.job_id}: not one of Sia's applications "
                f"({', '.join(sorted(apps))})",
                path=str(workload),
            )
        app = apps[model.name]
        gpus = arrival.spec.requested_gpus or 1
        if not elastic and gpus > _LARGEST_TYPE:
            raise InputError(
                f"job {arrival.spec.job_id}: {gpus} GPUs, more than any GPU type of Sia's "
                f"cluster has ({_LARGEST_TYPE}); as a rigid job it could never run",
                path=str(workload),
            )
        top = gpus
        if elastic:
            top = max(
                gpus, min(MAX_GPUS, max(t.max_batch // t.min_local for t in app.types.values()))
            )
        spec = replace(
            arrival.spec, min_gpus=1 if elastic else gpus, max_gpus=top, requested_gpus=gpus
        )
        out.append(replace(arrival, spec=spec, reference_gpus=gpus, physics=app))
    return out


def sia_env(
    arrivals: Sequence[Arrival],
    *,
    round_s: float = ROUND_S,
    slots: int = 32,
    max_steps: int = 1_000_000,
    forecaster: DemandForecaster | None = None,
    mix: bool = False,
    nodes: Sequence[NodeInfo] | None = None,
) -> ClusterEnv:
    """A ``ClusterEnv`` of Sia's world playing ``arrivals`` (``sia_arrivals``): its
    cluster, no noise, the restart cost of each job's physics, and every job placed on
    the nodes with the most free GPUs first, as Sia's policies place them
    (``forecaster``: the demand forecast of its observation, the default's if ``None``).
    ``mix``: beyond Sia's world, one data-parallel job may run across GPU types, each
    rank's batch share by its type's speed (``SiaApp.mixed_step``); a policy splits it
    with ``PolicyChoice.gpu_split``. ``nodes``: another cluster of Sia's GPU types
    than ``sia_nodes()``."""
    config = EnvConfig(
        mix_models=mix,
        slots=slots,
        round_s=round_s,
        restart_s=0.0,
        start_s=0.0,
        noise=False,
        max_steps=max_steps,
        pack_jobs=True,
    )
    return ClusterEnv(
        config,
        nodes=list(nodes) if nodes is not None else sia_nodes(),
        jobs=list(arrivals),
        forecaster=forecaster,
    )
