"""The environment's settings (``EnvConfig``): what an episode of the
reinforcement-learning environment is (cluster preset, job source, slots, clock, noise,
length) and what its reward weighs. One definition of each setting, with its default,
which the environment (``autotune.envs.cluster_env.ClusterEnv``), evaluation and the
command line build on; in the core so that none of them needs Gymnasium to read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from autotune.core import DEFAULT_ENERGY_WEIGHT, DEFAULT_RESTART_S, DEFAULT_ROUND_S
from autotune.rl.reward import NAN_PENALTY, OOM_PENALTY, RESTART_PENALTY, RewardWeights

__all__ = ["EVALUATION", "EnvConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvConfig:
    """What a ``ClusterEnv`` is, apart from the objects it is given (nodes, jobs,
    forecaster, provisioner): one definition of each setting and its default, which the
    command line and policy training build on."""

    small: bool = False
    """Without ``nodes``: the small preset (2 x 4 A100, 2 x 4 T4) instead of the daemon's
    default cluster (``autotune.envs.presets``)."""
    stream: bool = False
    """Without ``jobs``: the daemon's own built-in job stream (``initial_jobs`` waiting,
    then Poisson arrivals) instead of a trace-like synthetic workload."""
    n_jobs: int = 60
    """Without ``jobs``: jobs per episode."""
    initial_jobs: int = 6
    """With ``stream``: jobs waiting at the start."""
    mean_interarrival_s: float = 600.0
    """Without ``jobs``: mean seconds between two arrivals."""
    median_duration_s: float = 3600.0
    """Without ``jobs`` or ``stream``: median run time of a synthetic job at its
    reference configuration (log-normal)."""
    slots: int = 16
    """Jobs a policy decides each round (the first in queue order)."""
    round_s: float = DEFAULT_ROUND_S
    """Simulated seconds per decision round (per ``step``)."""
    restart_s: float = DEFAULT_RESTART_S
    """Downtime of a job whose configuration or placement changes."""
    start_s: float = 0.0
    """Downtime of a job that starts (the first time or after a preemption)."""
    wake_s: float = 120.0
    """Seconds a parked node takes to become usable (with a provisioner)."""
    noise: bool = True
    """Draw stragglers, divergence and measurement noise (else their expected values)."""
    mix_models: bool = False
    """One data-parallel job may run across GPU models where that pays
    (``SimConfig.mix_models``)."""
    pack_jobs: bool = False
    """Jobs that may span nodes take the nodes with the most free GPUs first
    (``SimConfig.pack_jobs``: a study's world that places jobs as its simulator does)."""
    drawn_sensitivity: bool = False
    """Each job of the performance model trains at a compression sensitivity drawn from
    the one measured over real tasks (``SimConfig.sensitivity``,
    ``autotune.perf.sensitivity``), where policies still price compression by the
    catalog; else every job at the catalog's."""
    max_steps: int = 500
    """Rounds before an episode is truncated."""
    oom_penalty: float = OOM_PENALTY
    """Reward lost per job whose configuration ran out of memory."""
    nan_penalty: float = NAN_PENALTY
    """Reward lost per divergence (NaN/Inf) event."""
    restart_penalty: float = RESTART_PENALTY
    """Reward lost per job-round of reconfiguration downtime."""
    energy_weight: float = DEFAULT_ENERGY_WEIGHT
    """Reward lost per kWh the cluster drew (normalized goodput per kWh)."""

    def __post_init__(self) -> None:
        for name in ("n_jobs", "slots", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"EnvConfig.{name}={getattr(self, name)!r}: must be >= 1")
        if self.initial_jobs < 0:
            raise ValueError(f"EnvConfig.initial_jobs={self.initial_jobs!r}: must be >= 0")
        for name in ("mean_interarrival_s", "median_duration_s", "round_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"EnvConfig.{name}={getattr(self, name)!r}: must be > 0")
        for name in (
            "restart_s",
            "start_s",
            "wake_s",
            "oom_penalty",
            "nan_penalty",
            "restart_penalty",
            "energy_weight",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"EnvConfig.{name}={getattr(self, name)!r}: must be >= 0")

    @property
    def reward_weights(self) -> RewardWeights:
        return RewardWeights(
            oom_penalty=self.oom_penalty,
            nan_penalty=self.nan_penalty,
            restart_penalty=self.restart_penalty,
            energy_weight=self.energy_weight,
        )


EVALUATION: Final = EnvConfig(slots=32, max_steps=100_000)
"""The environment an evaluation plays by default (``autotune eval``,
``autotune.policies.evaluate``): the whole trace (up to 100,000 rounds), 32 slots as the
daemon serves the learned policy."""
