"""The backends ``autotune daemon --backend NAME`` can drive, by name.

A backend is built from the settings at start-up; adding one is a factory here (the
Ray executor registers ``ray`` the same way)."""

from __future__ import annotations

from collections.abc import Callable

from autotune.daemon.settings import Settings
from autotune.errors import InputError
from autotune.interfaces import Backend

__all__ = ["BACKENDS", "build_backend"]


def _simulated(settings: Settings) -> Backend:
    from autotune.envs.simulator import SimConfig, SimulatedCluster

    if settings.sim_workload is not None:
        from autotune.envs.presets import pollux_nodes
        from autotune.envs.workloads import pollux_arrivals

        arrivals = pollux_arrivals(settings.sim_workload, settings.sim_workload_jobs)
        return SimulatedCluster(
            SimConfig(
                seed=settings.seed,
                round_s=settings.round_period_s,
                nodes=tuple(pollux_nodes(settings.sim_gpus)),
                wake_s=settings.provisioning_wake_s,
            ),
            arrivals=arrivals,
        )
    config = SimConfig(
        seed=settings.seed,
        round_s=settings.round_period_s,
        mean_interarrival_s=settings.sim_mean_interarrival_s,
        initial_jobs=settings.sim_initial_jobs,
        max_jobs=settings.sim_max_jobs,
        wake_s=settings.provisioning_wake_s,
        mix_models=settings.mix_gpu_models,
    )
    if settings.cluster_file is not None:
        from dataclasses import replace

        from autotune.catalog.clusters import load_cluster

        cluster = load_cluster(settings.cluster_file)
        config = replace(
            config,
            nodes=cluster.nodes,
            coeffs=cluster.coefficients,
            task_coeffs=tuple(cluster.task_coefficients.items()),
        )
    return SimulatedCluster(config)


def _ray(settings: Settings) -> Backend:
    from autotune.executor.ray_backend import RayBackend

    cluster = None
    if settings.cluster_file is not None:
        from autotune.catalog.clusters import load_cluster

        cluster = load_cluster(settings.cluster_file)
    return RayBackend(
        cluster=cluster,
        checkpoint_root=settings.data_dir / "checkpoints",
        address=settings.ray_address,
        checkpoint_every=settings.checkpoint_every,
        step_timeout_s=settings.step_timeout_s,
        adaptive_topk=settings.adaptive_topk,
        balance_batch=settings.balance_batch,
        mix_models=settings.mix_gpu_models,
    )


BACKENDS: dict[str, Callable[[Settings], Backend]] = {"sim": _simulated, "ray": _ray}


def build_backend(settings: Settings) -> Backend:
    factory = BACKENDS.get(settings.backend)
    if factory is None:
        raise InputError(
            f"setting backend={settings.backend!r}: unknown; available: {', '.join(BACKENDS)}"
        )
    return factory(settings)
