"""The Pollux-compatible world: Pollux's cluster, clock, physics and knobs around the
simulated cluster the daemon runs.

What makes it Pollux's (Qiao et al., OSDI'21; the artifact's ``simulator/``):

- the cluster: ``autotune.envs.presets.pollux_nodes`` (nodes of 4 T4);
- the clock: a scheduling round every ``ROUND_S`` (60 s) and ``RESTART_S`` (30 s)
  without progress at every start and restart;
- the physics: each job advances on its application's measured step times and gradient
  statistics (``compat_arrivals``: ``Arrival.physics`` is its ``TraceApp``), with no
  noise; a new batch on the same GPUs changes in place;
- the knobs: each job's GPU count and batch size, data parallel, fp32, no compression
  (``to_pollux_knobs``);
- the measure: the average job completion time, so the reward of a round is minus its
  job-hours (the active jobs at its start times ``ROUND_S`` / 3600, Little's law).

``PolluxCompatEnv`` wraps a ``ClusterEnv`` built for this world. Its action is one number
per slot, log2 of the job's weight in the goodput allocation (``WEIGHT_RANGE``;
``weight_space``, ``decode_weights``), which sets every job's GPU count and batch size
(``autotune.studies.pollux.goodput.GoodputPolicy.allocate``); jobs beyond the slots
weigh 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from autotune.core import JobConfig, Layout
from autotune.demand import DemandForecaster
from autotune.envs.cluster_env import ClusterEnv, EnvConfig
from autotune.envs.presets import pollux_nodes
from autotune.envs.simulator import Arrival, SimulatedCluster
from autotune.envs.traces import pollux_workload
from autotune.envs.workloads import MAX_GPUS, jobs_from_trace, pick_jobs
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.rl.action import InvalidActionError
from autotune.rl.observation import slot_jobs
from autotune.studies.pollux.goodput import FAIRNESS_P, GoodputPolicy, SizedGoodputPolicy
from autotune.studies.pollux.trace import load_trace_apps

__all__ = [
    "RESTART_S",
    "ROUND_S",
    "WEIGHT_RANGE",
    "PolluxCompatEnv",
    "WeightedAllocation",
    "allocator",
    "base_weights",
    "compat_arrivals",
    "compat_env",
    "decode_weights",
    "encode_weights",
    "measured_physics",
    "to_pollux_knobs",
    "weight_space",
]

ROUND_S: Final = 60.0
"""Pollux's simulator: a scheduling round every 60 s (``--interval``) ..."""
RESTART_S: Final = 30.0
"""... and 30 s without progress at every start and restart (``Job.reallocate``)."""
WEIGHT_RANGE: Final = (-6.0, 6.0)
"""Bounds of an action entry: log2 of a job's weight in the goodput allocation (a weight
of 1/64 to 64; beyond is clipped)."""


# -- the jobs ---------------------------------------------------------------------------


def compat_arrivals(
    workload: str | Path, traces: str | Path, jobs: str | None = None
) -> list[Arrival]:
    """The jobs of a Pollux workload CSV on their applications' measured physics
    (``measured_physics``), ``jobs`` (``"START:STOP"``, a slice of the arrival order;
    ``None``: all) at the workload's own arrival times (Pollux's clock, not re-based:
    its rounds start at 0); ``traces``: Pollux's traces folder."""
    arrivals = pick_jobs(jobs_from_trace(pollux_workload(workload, rebase=False)), jobs, workload)
    return measured_physics(arrivals, traces)


def measured_physics(arrivals: Sequence[Arrival], traces: str | Path) -> list[Arrival]:
    """Pollux jobs on their applications' measured physics (``Arrival.physics`` is its
    ``TraceApp``); ``traces``: Pollux's traces folder. ``InputError`` for a job of an
    application Pollux did not measure."""
    measured = load_trace_apps(traces)
    out: list[Arrival] = []
    for arrival in arrivals:
        model = arrival.spec.model
        if model is None or model.name not in measured:
            raise InputError(
                f"job {arrival.spec.job_id}: not a Pollux application "
                f"({', '.join(sorted(measured))}); the Pollux-compatible mode runs only those"
            )
        trace = measured[model.name]
        # Elastic up to what the traces measured: the largest batch at the smallest
        # local batch (Pollux's bound on a job's replicas), at most MAX_GPUS; ncf on the
        # one GPU Pollux's artifact gives it.
        top = max(arrival.spec.min_gpus, min(MAX_GPUS, trace.max_batch // trace.min_local))
        if trace.fixed is not None:
            top = trace.fixed[0]
        spec = replace(arrival.spec, max_gpus=max(top, arrival.spec.requested_gpus or 1))
        out.append(replace(arrival, spec=spec, physics=trace))
    return out


# -- the knobs --------------------------------------------------------------------------


def to_pollux_knobs(choices: Mapping[str, PolicyChoice]) -> dict[str, PolicyChoice]:
    """``choices`` with only Pollux's knobs kept: each configuration becomes plain data
    parallelism over its GPUs in fp32 without compression, with its batch size (the
    memory rule adds gradient accumulation or checkpointing where the batch needs it)."""
    out: dict[str, PolicyChoice] = {}
    for job_id, choice in choices.items():
        config = choice.config
        if config is not None:
            batch = config.global_batch
            plain = JobConfig(
                layout=Layout(world_size=config.world_size),
                # At least a sample per data-parallel rank (tensor- or pipeline-parallel
                # ranks shared one).
                global_batch=None if batch is None else max(batch, config.world_size),
            )
            if plain != config:
                choice = replace(choice, config=plain, reason=f"{choice.reason} (Pollux's knobs)")
        out[job_id] = choice
    return out


def weight_space(slots: int) -> spaces.Box:
    """One entry per slot: log2 of the job's weight in the goodput allocation."""
    low, high = WEIGHT_RANGE
    return spaces.Box(low, high, (slots,), dtype=np.float32)


def decode_weights(
    action: np.ndarray,
    snapshot: ClusterSnapshot,
    slots: int,
    base: Mapping[str, float] | None = None,
    *,
    quantum: float | None = None,
) -> dict[str, float]:
    """The jobs' weights an action of ``weight_space`` means (entries beyond
    ``WEIGHT_RANGE`` clipped, as for any bounded continuous action; rounded to a
    multiple of ``quantum`` where given, so that an entry near zero is exactly zero).
    Raises ``InvalidActionError`` for a wrong length or a value that is not a number.

    ``base`` (a residual policy's: its teacher's weights): an entry multiplies the slot
    job's base weight by 2 to its power instead of setting it, and jobs beyond the
    slots keep their base weight; without it they weigh 1."""
    flat = np.asarray(action, dtype=np.float64).reshape(-1)
    if flat.shape != (slots,):
        raise InvalidActionError(f"action has {flat.size} entries; expected {slots}")
    if not np.isfinite(flat).all():
        raise InvalidActionError("action has an entry that is not a finite number")
    low, high = WEIGHT_RANGE
    if quantum is not None:
        if not quantum > 0:
            raise ValueError(f"quantum={quantum!r}: must be > 0")
        flat = np.round(flat / quantum) * quantum
    out = dict(base or {})
    for slot, job in enumerate(slot_jobs(snapshot, slots)):
        job_id = job.spec.job_id
        out[job_id] = float(2.0 ** np.clip(flat[slot], low, high)) * out.get(job_id, 1.0)
    return out


def encode_weights(
    weights: dict[str, float],
    snapshot: ClusterSnapshot,
    slots: int,
    base: Mapping[str, float] | None = None,
) -> np.ndarray:
    """The action that decodes to (about) ``weights`` (a slot whose job has none: 1),
    relative to ``base`` where given (see ``decode_weights``)."""
    low, high = WEIGHT_RANGE
    out = np.zeros(slots, dtype=np.float32)
    for slot, job in enumerate(slot_jobs(snapshot, slots)):
        job_id = job.spec.job_id
        ratio = weights.get(job_id, 1.0) / (base or {}).get(job_id, 1.0)
        out[slot] = float(np.clip(math.log2(ratio), low, high))
    return out


# -- the environment ---------------------------------------------------------------------


class WeightedAllocation(Protocol):
    """A goodput allocation that weighs each job's term (``GoodputPolicy``, Sia's
    ``SiaGoodputPolicy``): what a weight action goes through."""

    def allocate(
        self, snapshot: ClusterSnapshot, weights: Mapping[str, float] | None = None
    ) -> dict[str, PolicyChoice]: ...

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound: ...


class PolluxCompatEnv(gym.Wrapper[np.ndarray, np.ndarray, np.ndarray, np.ndarray]):
    """A ``ClusterEnv`` in the Pollux-compatible world (see the module docstring): its
    action is every slot job's log2 weight in the goodput allocation (with fairness
    ``fairness_p``, built afresh each episode), its choices are kept to Pollux's knobs,
    its reward is minus the round's job-hours (``info["reward_parts"]["jct"]``).

    ``residual_exponent`` (a residual policy's world): the action is instead each slot
    job's log2 correction to the weight ``goodput-size`` gives it at that exponent
    (``SizedGoodputPolicy.weights``), so the zero action is that teacher, and jobs
    beyond the slots keep the teacher's weight."""

    def __init__(
        self,
        env: ClusterEnv,
        *,
        fairness_p: float = FAIRNESS_P,
        residual_exponent: float | None = None,
    ) -> None:
        super().__init__(env)
        self.cluster = env
        self.fairness_p = fairness_p
        self.residual_exponent = residual_exponent
        self.action_space = weight_space(env.slots)
        self.allocator: WeightedAllocation | None = None

    quantum: float | None = None
    """The step actions are rounded to (``decode_weights``); ``None``: not rounded."""

    def make_allocator(self) -> WeightedAllocation:
        """The goodput allocation of an episode (``allocator``); a world of its own
        (Sia's) gives its own."""
        return allocator(self.cluster, self.fairness_p, self.residual_exponent)

    def base(self, snapshot: ClusterSnapshot) -> dict[str, float] | None:
        """The weights an action corrects (``base_weights``): the teacher's for a
        residual policy, else ``None``."""
        assert isinstance(self.allocator, GoodputPolicy)
        return base_weights(self.allocator, snapshot)

    # What policies and training read of the environment, as a ClusterEnv has it.
    @property
    def snapshot(self) -> ClusterSnapshot | None:
        return self.cluster.snapshot

    @property
    def sim(self) -> SimulatedCluster | None:
        return self.cluster.sim

    @property
    def slots(self) -> int:
        return self.cluster.slots

    @property
    def round_s(self) -> float:
        return self.cluster.round_s

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.cluster.reset(seed=seed, options=options)
        self.allocator = self.make_allocator()
        return obs, info

    def choices(self, action: np.ndarray) -> dict[str, PolicyChoice]:
        """What ``action`` means for the current state: the goodput allocation with the
        decoded weights (``InvalidActionError`` for a malformed action)."""
        snapshot = self.cluster.snapshot
        if snapshot is None or self.allocator is None:
            raise RuntimeError("call reset() before step()")
        weights = decode_weights(
            action, snapshot, self.slots, self.base(snapshot), quantum=self.quantum
        )
        return self.allocator.allocate(snapshot, weights)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return self.step_choices(self.choices(action))

    def step_choices(
        self, choices: Mapping[str, PolicyChoice]
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One round with choices made directly, kept to Pollux's knobs."""
        snapshot = self.cluster.snapshot
        if snapshot is None:
            raise RuntimeError("call reset() before step()")
        active = sum(1 for j in snapshot.jobs if j.state in ("pending", "running"))
        obs, _, terminated, truncated, info = self.cluster.step_choices(to_pollux_knobs(choices))
        value = -active * self.round_s / 3600.0
        info["reward_parts"] = {"jct": value}
        return obs, value, terminated, truncated, info


def allocator(env: ClusterEnv, fairness_p: float, residual_exponent: float | None) -> GoodputPolicy:
    """The goodput allocation actions go through: ``goodput-size`` at
    ``residual_exponent`` where a residual policy corrects its weights (it allocates as
    ``GoodputPolicy`` does), else ``GoodputPolicy``."""
    if residual_exponent is None:
        return GoodputPolicy(env, p=fairness_p)
    return SizedGoodputPolicy(env, exponent=residual_exponent, p=fairness_p)


def base_weights(allocation: GoodputPolicy, snapshot: ClusterSnapshot) -> dict[str, float] | None:
    """The weights an action corrects: the teacher's where ``allocation`` is a residual
    policy's (``allocator``), else ``None``."""
    if isinstance(allocation, SizedGoodputPolicy):
        return allocation.weights(snapshot)
    return None


def compat_env(
    workload: str | Path,
    traces: str | Path,
    *,
    gpus: int = 64,
    slots: int = 32,
    max_steps: int = 5000,
    forecaster: DemandForecaster | None = None,
    fairness_p: float = FAIRNESS_P,
    residual_exponent: float | None = None,
    jobs: str | None = None,
    arrivals: Sequence[Arrival] | None = None,
) -> PolluxCompatEnv:
    """The Pollux-compatible environment of a workload CSV (``traces``: Pollux's traces
    folder), on ``gpus`` T4 GPUs; ``arrivals``: its jobs already loaded
    (``compat_arrivals``); ``residual_exponent``: see ``PolluxCompatEnv``."""
    config = EnvConfig(
        slots=slots,
        round_s=ROUND_S,
        restart_s=RESTART_S,
        start_s=RESTART_S,
        noise=False,
        max_steps=max_steps,
    )
    env = ClusterEnv(
        config,
        nodes=pollux_nodes(gpus),
        jobs=list(arrivals) if arrivals is not None else compat_arrivals(workload, traces, jobs),
        forecaster=forecaster,
    )
    return PolluxCompatEnv(env, fairness_p=fairness_p, residual_exponent=residual_exponent)
