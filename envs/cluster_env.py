"""``ClusterEnv``: the training cluster as a Gymnasium environment.

## Description

Jobs arrive at a GPU cluster, queue and train; every step is one decision round of
``interval_s`` simulated seconds (``autotune.envs.simulator``). For each of the first
``slots`` active jobs (queue order), the agent picks a gradient compression, a precision
map, a parallel layout (GPU count and data/tensor/pipeline mode), a batch size, and
whether to change the job's config at all. Placement follows from the layout.

## Action space

``MultiDiscrete([6, 4, 21, 4, 2] * slots)``, per slot: compression (none, top-k 10%,
top-k 1%, int8, fp8, PowerSGD rank 4), precision (fp32, bf16, fp16, fp8 matmuls), layout
(GPU count 1-64 by powers of two x mode dp / dp x tp2 / dp x pp2), batch scale (0.5, 1,
2, 4 x the job's batch), keep (0) or change (1). Entries for empty slots are ignored.

## Observation space

``Box(-inf, inf, (4*2 + 4 + slots*16,), float32)``: per GPU model (fastest first, padded
to 4) total and free GPUs as shares of the cluster; queue length, busy share, load now
and the load forecast (persistence unless a ``forecaster`` is given); per slot 16
features of the job (model size, requested and held GPUs, its current choices, waiting
time, normalized goodput of the last round, progress, OOM).

## Rewards

Sum over running jobs of goodput / the job's reference goodput (its requested GPUs, data
parallel, fp32), averaged over the round; minus ``oom_penalty`` per job whose config
ran out of memory, ``nan_penalty`` per divergence event, ``restart_penalty`` times the
share of the round lost to each reconfiguration, and ``energy_weight`` per kWh.

## Starting state

An empty cluster; jobs from ``jobs`` (a trace) or drawn from ``self.np_random``.

## Episode end

Terminated when every job has finished; truncated after ``max_steps``.

## Arguments

``gymnasium.make("autotune/Cluster-v0")`` (32 GPUs of three generations, 16 slots) or
``"autotune/ClusterSmall-v0"`` (16 GPUs, 4 slots, short episodes); keyword arguments of
``ClusterEnv`` override either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from autotune.core import NodeInfo
from autotune.envs.presets import default_nodes, small_nodes
from autotune.envs.simulator import (
    BATCH_SCALES,
    COMPRESSIONS,
    N_LAYOUTS,
    PRECISIONS,
    Choice,
    ClusterSimulator,
    Job,
    RoundOutcome,
    SimConfig,
)
from autotune.envs.workloads import synthetic_jobs

__all__ = ["ACTION_DIMS", "ClusterEnv", "decode_action", "encode_choice"]

ACTION_DIMS: Final = (len(COMPRESSIONS), len(PRECISIONS), N_LAYOUTS, len(BATCH_SCALES), 2)
MAX_GPU_TYPES: Final = 4
SLOT_FEATURES: Final = 16
GLOBAL_FEATURES: Final = MAX_GPU_TYPES * 2 + 4


def encode_choice(choice: Choice | None, change: bool = True) -> list[int]:
    """The five action entries of one slot."""
    c = choice or Choice()
    return [c.compression, c.precision, c.layout, c.batch, int(change)]


def decode_action(action: np.ndarray, slot: int) -> tuple[Choice, bool]:
    base = slot * len(ACTION_DIMS)
    a = [int(x) for x in action[base : base + len(ACTION_DIMS)]]
    return Choice(compression=a[0], precision=a[1], layout=a[2], batch=a[3]), bool(a[4])


class ClusterEnv(gym.Env[np.ndarray, np.ndarray]):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's convention

    def __init__(
        self,
        *,
        nodes: Sequence[NodeInfo] | None = None,
        jobs: Sequence[Job] | Callable[[], Sequence[Job]] | None = None,
        n_jobs: int = 60,
        mean_interarrival_s: float = 600.0,
        median_duration_s: float = 3600.0,
        slots: int = 16,
        interval_s: float = 300.0,
        restart_s: float = 30.0,
        max_steps: int = 500,
        queue_order: str = "fifo",
        noise: bool = True,
        oom_penalty: float = 1.0,
        nan_penalty: float = 0.5,
        restart_penalty: float = 1.0,
        energy_weight: float = 0.0,
        small: bool = False,
        forecaster: Callable[[Sequence[float], float, float], float] | None = None,
    ) -> None:
        if nodes is not None:
            self.nodes = list(nodes)
        else:
            self.nodes = small_nodes() if small else default_nodes()
        self._jobs = jobs
        self.n_jobs = n_jobs
        self.mean_interarrival_s = mean_interarrival_s
        self.median_duration_s = median_duration_s
        self.slots = slots
        self.sim_config = SimConfig(
            interval_s=interval_s,
            restart_s=restart_s,
            queue_order="las" if queue_order == "las" else "fifo",
            noise=noise,
        )
        self.max_steps = max_steps
        self.weights = (oom_penalty, nan_penalty, restart_penalty, energy_weight)
        self.action_space = spaces.MultiDiscrete(np.array(ACTION_DIMS * slots, dtype=np.int64))
        size = GLOBAL_FEATURES + slots * SLOT_FEATURES
        self._obs_size = size
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)
        self.forecast: float | None = None
        """Predicted busy share of the cluster 15 minutes ahead; a forecaster sets it."""
        self.forecaster = forecaster
        """``forecaster(busy_history, interval_s, now_s)``: the busy share 15 minutes
        ahead from the busy share of every round so far (oldest first); called before
        each observation (``autotune.policies.forecast.EnvForecast``)."""
        self._busy_history: list[float] = []
        self.sim: ClusterSimulator | None = None
        self.steps = 0

    # -- Gymnasium API ------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if callable(self._jobs):
            jobs = list(self._jobs())
        elif self._jobs is not None:
            jobs = [_fresh(j) for j in self._jobs]
        else:
            jobs = synthetic_jobs(
                self.np_random,
                n_jobs=self.n_jobs,
                mean_interarrival_s=self.mean_interarrival_s,
                median_duration_s=self.median_duration_s,
            )
        self.sim = ClusterSimulator(self.nodes, jobs, config=self.sim_config, rng=self.np_random)
        self.sim.skip_idle()
        self.steps = 0
        self._last_busy = 0.0
        self._busy_history = []
        return self._observe(), self._info(None)

    def step(
        self, action: np.ndarray
    ) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        sim = self._require()
        choices: dict[str, Choice | None] = {}
        for slot, job in enumerate(sim.active[: self.slots]):
            choice, change = decode_action(action, slot)
            if change or job.choice is None:
                choices[job.job_id] = choice
        outcome = sim.advance(choices)
        sim.skip_idle()
        self.steps += 1
        self._last_busy = outcome.busy_gpus / sim.total_gpus
        oom_w, nan_w, restart_w, energy_w = self.weights
        lost = sim.config.restart_s / sim.config.interval_s
        reward = (
            outcome.normalized_goodput
            - oom_w * outcome.ooms
            - nan_w * outcome.nan_events
            - restart_w * lost * outcome.restarts
            - energy_w * outcome.energy_kwh
        )
        terminated = sim.done
        truncated = not terminated and self.steps >= self.max_steps
        return self._observe(), float(reward), terminated, truncated, self._info(outcome)

    # -- helpers ------------------------------------------------------------------------

    def _require(self) -> ClusterSimulator:
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        return self.sim

    def _observe(self) -> np.ndarray:
        sim = self._require()
        obs = np.zeros(self._obs_size, dtype=np.float32)
        total = float(sim.total_gpus)
        for i, model in enumerate(sim.gpu_models[:MAX_GPU_TYPES]):
            obs[2 * i] = sum(n.gpu_count for n in sim.nodes if n.gpu_model == model) / total
            obs[2 * i + 1] = sim.free_gpus(model) / total
        active = sim.active
        g = MAX_GPU_TYPES * 2
        obs[g] = len(active) / self.slots
        obs[g + 1] = self._last_busy
        obs[g + 2] = 1 - sim.free_gpus() / total
        if self.forecaster is not None:
            self._busy_history.append(float(obs[g + 2]))
            self.forecast = self.forecaster(self._busy_history, sim.config.interval_s, sim.now)
        obs[g + 3] = self.forecast if self.forecast is not None else obs[g + 2]
        for slot, job in enumerate(active[: self.slots]):
            base = GLOBAL_FEATURES + slot * SLOT_FEATURES
            c = job.choice or Choice()
            waiting = (sim.now - job.submit_s) if job.start_s is None else 0.0
            obs[base : base + SLOT_FEATURES] = (
                1.0,
                float(job.running),
                math.log1p(waiting / 3600),
                math.log10(job.model.parameters) / 10,
                math.log10(job.model.flops_per_sample) / 15,
                float(job.model.hidden_size > 0),
                job.requested_gpus / 64,
                job.gpus / 64,
                c.compression / (len(COMPRESSIONS) - 1),
                c.precision / (len(PRECISIONS) - 1),
                c.layout / (N_LAYOUTS - 1),
                c.batch / (len(BATCH_SCALES) - 1),
                min(job.last_goodput / job.reference_goodput, 8.0) / 8,
                job.progress / job.work if job.work else 0.0,
                float(job.oom),
                float(sim.gpu_models.index(job.gpu_model) + 1) / MAX_GPU_TYPES
                if job.gpu_model
                else 0.0,
            )
        return obs

    def _info(self, outcome: RoundOutcome | None) -> dict[str, Any]:
        sim = self._require()
        info: dict[str, Any] = {"time_s": sim.now, "finished": len(sim.finished)}
        if outcome is not None:
            info.update(
                normalized_goodput=outcome.normalized_goodput,
                ooms=outcome.ooms,
                nan_events=outcome.nan_events,
                restarts=outcome.restarts,
                energy_kwh=outcome.energy_kwh,
                busy_gpus=outcome.busy_gpus,
            )
        return info


def _fresh(job: Job) -> Job:
    """A copy of a trace job with no run state, so episodes don't share state."""
    return Job(
        job_id=job.job_id,
        model=job.model,
        coeffs=job.coeffs,
        submit_s=job.submit_s,
        work=job.work if job.duration_s is None else 0.0,
        duration_s=job.duration_s,
        base_batch=job.base_batch,
        requested_gpus=job.requested_gpus,
        min_gpus=job.min_gpus,
        max_gpus=job.max_gpus,
        max_local_batch=job.max_local_batch,
    )
