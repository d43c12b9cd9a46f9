"""Cluster environments: trace loaders, the simulator, the Gymnasium environment and the
simulated cluster backend.

Importing this package registers ``autotune/Cluster-v0`` and ``autotune/ClusterSmall-v0``
with Gymnasium lazily (by entry point string): gymnasium is imported, the environment
module only when an environment is made.
"""

from __future__ import annotations

import contextlib


def _register() -> None:
    from gymnasium.envs.registration import register, registry

    if "autotune/Cluster-v0" not in registry:
        register(
            id="autotune/Cluster-v0",
            entry_point="autotune.envs.cluster_env:ClusterEnv",
            kwargs={
                "slots": 16,
                "n_jobs": 60,
                "max_steps": 500,
                "stream": True,
                "mean_interarrival_s": 300.0,
            },
        )
    if "autotune/ClusterSmall-v0" not in registry:
        register(
            id="autotune/ClusterSmall-v0",
            entry_point="autotune.envs.cluster_env:ClusterEnv",
            kwargs={
                "nodes": None,
                "slots": 4,
                "n_jobs": 12,
                "mean_interarrival_s": 900.0,
                "median_duration_s": 1800.0,
                "max_steps": 64,
                "small": True,
            },
        )


with contextlib.suppress(ImportError):  # gymnasium is a dependency; tolerate its absence
    _register()
