"""What a decision round earned: the reward of the reinforcement-learning contract.

``RoundOutcome`` is what a backend that keeps simulated time reports of each round it
runs (``autotune.interfaces.SimulatedTime``); ``reward`` turns it into the round's reward
and its parts, ``job_rewards`` into each job's own. The Gymnasium environment pays these
when it trains a policy and the daemon's transition log records the same ones for
replay, so a policy learns offline from the reward it was trained on.

The reward: the sum over running jobs of goodput / the job's reference goodput (its
reference GPUs, data parallel, fp32), averaged over the round; minus ``oom_penalty`` per
job whose configuration ran out of memory, ``nan_penalty`` per divergence event,
``restart_penalty`` times the job-rounds lost to reconfiguration downtime, and
``energy_weight`` per kWh the cluster drew.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from autotune.core import DEFAULT_ENERGY_WEIGHT

__all__ = [
    "NAN_PENALTY",
    "OOM_PENALTY",
    "RESTART_PENALTY",
    "JobRound",
    "RewardWeights",
    "RoundOutcome",
    "job_rewards",
    "reward",
]

OOM_PENALTY: Final = 1.0
"""Reward lost per job whose configuration ran out of memory."""
NAN_PENALTY: Final = 0.5
"""Reward lost per divergence (NaN/Inf) event."""
RESTART_PENALTY: Final = 1.0
"""Reward lost per job-round of reconfiguration downtime."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardWeights:
    """The weights of the reward's penalty terms."""

    oom_penalty: float = OOM_PENALTY
    nan_penalty: float = NAN_PENALTY
    restart_penalty: float = RESTART_PENALTY
    energy_weight: float = DEFAULT_ENERGY_WEIGHT
    """Normalized goodput given up per kWh (the daemon's ``energy_weight`` setting)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRound:
    """What one job did in a round: the parts of the round's outcome that are its own."""

    normalized_goodput: float = 0.0
    ooms: int = 0
    nan_events: int = 0
    restart_s: float = 0.0
    energy_kwh: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundOutcome:
    """What the cluster did in one decision round."""

    normalized_goodput: float
    """Sum over running jobs of goodput / reference goodput, averaged over the round."""
    ooms: int
    nan_events: int
    restarts: int
    restart_s: float
    """Job-seconds of downtime served this round."""
    energy_kwh: float
    idle_energy_kwh: float = 0.0
    """The part of ``energy_kwh`` idle GPUs drew (powered, waking or parked)."""
    finished: int
    busy_gpus: float
    jobs: Mapping[str, JobRound] = field(default_factory=dict)
    """Each running job's share of the round (the cluster's totals add idle GPUs' energy)."""


def reward(
    outcome: RoundOutcome, *, round_s: float, weights: RewardWeights = RewardWeights()
) -> tuple[float, dict[str, float]]:
    """The reward of one round and its parts (the same for training and replay)."""
    parts = {
        "goodput": outcome.normalized_goodput,
        "oom": -weights.oom_penalty * outcome.ooms,
        "nan": -weights.nan_penalty * outcome.nan_events,
        "restart": -weights.restart_penalty * outcome.restart_s / round_s,
        "energy": -weights.energy_weight * outcome.energy_kwh,
    }
    return float(sum(parts.values())), parts


def job_rewards(
    outcome: RoundOutcome, *, round_s: float, weights: RewardWeights = RewardWeights()
) -> dict[str, tuple[float, dict[str, float]]]:
    """Each running job's own reward in the round and its parts, by job id: ``reward``
    applied to what the job alone did (``RoundOutcome.jobs``). The round's reward is
    their sum plus the idle GPUs' energy, which belongs to no job."""
    return {
        job_id: reward(
            RoundOutcome(
                normalized_goodput=mine.normalized_goodput,
                ooms=mine.ooms,
                nan_events=mine.nan_events,
                restarts=0,
                restart_s=mine.restart_s,
                energy_kwh=mine.energy_kwh,
                finished=0,
                busy_gpus=0.0,
            ),
            round_s=round_s,
            weights=weights,
        )
        for job_id, mine in outcome.jobs.items()
    }
