"""Tiresias in the Pollux-compatible world against Pollux's own simulator, and where our
default world differs (``bench/pollux_compat.py`` runs it).

``run`` plays a workload's jobs under one policy in a ``ClusterEnv`` of Pollux's
testbed; ``decompose`` plays the same jobs one change at a time from the
Pollux-compatible world towards our default world:

- ``compat``: the Pollux-compatible world (measured physics, 60 s rounds, 30 s per
  start and restart, no noise);
- ``compat_300s``: measured physics with our default rounds (300 s) and no start cost;
- ``model_60s``: our performance model (per-application coefficients, work in samples
  at the reference batch) with Pollux's rounds and start cost, no noise;
- ``model_300s``: our performance model with our rounds and free starts, no noise;
- ``default``: our default world (model physics, 300 s rounds, free starts, stragglers
  and divergence drawn).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import pollux_nodes
from autotune.envs.simulator import Arrival
from autotune.envs.workloads import pollux_arrivals
from autotune.interfaces import Policy
from autotune.policies.evaluate import run_episode
from autotune.policies.tiresias import TiresiasPolicy
from autotune.studies.pollux.env import compat_arrivals
from autotune.studies.pollux.goodput import GoodputPolicy
from autotune.studies.pollux.optimus import OptimusPolicy

__all__ = ["decompose", "run"]


def run(
    jobs: list[Arrival], *, round_s: float, start_s: float, noise: bool, policy: str = "tiresias"
) -> dict[str, Any]:
    """One play of ``jobs`` on Pollux's 64-GPU testbed under ``policy`` (``tiresias``,
    ``goodput`` or ``optimus``): the evaluation's metrics, the preemptions and the wall
    time."""
    env = ClusterEnv(
        nodes=pollux_nodes(64),
        jobs=jobs,
        slots=32,
        round_s=round_s,
        restart_s=30.0,
        start_s=start_s,
        noise=noise,
        max_steps=1_000_000,
    )
    began = time.perf_counter()
    makers: dict[str, Callable[[], Policy]] = {
        "tiresias": TiresiasPolicy,
        "goodput": lambda: GoodputPolicy(env),
        "optimus": lambda: OptimusPolicy(env),
    }
    chosen = makers[policy]()
    result = run_episode(chosen, env, seed=0)
    assert env.sim is not None
    result["preemptions"] = sum(j.preemptions for j in env.sim.jobs.values())
    result["wall_s"] = round(time.perf_counter() - began, 2)
    return result


def decompose(workload: Path, traces: Path) -> dict[str, dict[str, Any]]:
    """Tiresias on the workload in the four worlds between the Pollux-compatible one
    and our default (see the module docstring)."""
    measured = compat_arrivals(workload, traces)
    modelled = pollux_arrivals(workload)
    return {
        "compat_300s": run(measured, round_s=300, start_s=0, noise=False),
        "model_60s": run(modelled, round_s=60, start_s=30, noise=False),
        "model_300s": run(modelled, round_s=300, start_s=0, noise=False),
        "default": run(modelled, round_s=300, start_s=0, noise=True),
    }
