"""Baseline scheduling policies for the cluster environment, with the RL policy's
interface: ``act(env, observation) -> action`` (the env's ``MultiDiscrete`` vector).

Baselines may read the simulator's state (``env.sim``) where the RL policy sees only the
observation; ``queue_order`` tells the evaluator how the queue is ordered.

- ``static``: the requested GPUs, data parallel, fp32, no compression, the job's batch;
  set once, never changed.
- ``rules``: hand-written rules, set at arrival: 16-bit where the GPU has a fast path
  (bf16, else fp16 for models that tolerate it), int8 gradient compression when the
  job would spend over 30% of its step synchronising, twice the requested GPUs when
  nobody is waiting and they are free.
- ``random``: uniform over the action space (a lower bound).
- ``tiresias``: static configs, queue ordered by least attained service (GPU-seconds),
  Tiresias' discretised LAS without its priority queues (Gu et al., NSDI'19); jobs are
  not preempted.
- ``oracle``: each round, for every job and GPU count the best config of the whole grid
  under the noise-free model, then GPUs shared among jobs by dynamic programming to
  maximise the round's total normalized goodput (joint over jobs); a config changes
  only when it gains more than the restart costs. An upper bound for one-round
  decisions, not for whole schedules.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Final, Protocol

import numpy as np

from autotune.catalog.devices import device
from autotune.envs.cluster_env import ACTION_DIMS, ClusterEnv, encode_choice
from autotune.envs.simulator import (
    BATCH_SCALES,
    COMPRESSIONS,
    GPU_OPTIONS,
    LAYOUT_MODES,
    PRECISIONS,
    Choice,
    ClusterSimulator,
    Job,
    job_config,
)

__all__ = ["BASELINES", "SimPolicy", "make_policy"]

_FP16: Final = PRECISIONS.index(next(p for p in PRECISIONS if p.ffn == "fp16"))
_BF16: Final = PRECISIONS.index(next(p for p in PRECISIONS if p.ffn == "bf16"))
_INT8: Final = next(i for i, c in enumerate(COMPRESSIONS) if c.kind == "int8")
_UNIT: Final = BATCH_SCALES.index(1.0)


class SimPolicy(Protocol):
    name: str
    queue_order: str

    def act(self, env: ClusterEnv, observation: np.ndarray) -> np.ndarray: ...


def _keep_all(env: ClusterEnv) -> np.ndarray:
    return np.zeros(len(ACTION_DIMS) * env.slots, dtype=np.int64)


def _sim(env: ClusterEnv) -> ClusterSimulator:
    if env.sim is None:
        raise RuntimeError("reset the environment first")
    return env.sim


class _SetOnArrival(ABC):
    """Decides a job's config the first time it appears in a slot, then keeps it."""

    name = ""
    queue_order = "fifo"

    @abstractmethod
    def choose(self, sim: ClusterSimulator, job: Job) -> Choice:
        """The config of ``job``, decided once."""

    def act(self, env: ClusterEnv, observation: np.ndarray) -> np.ndarray:
        sim = _sim(env)
        action = _keep_all(env)
        width = len(ACTION_DIMS)
        for slot, job in enumerate(sim.active[: env.slots]):
            if job.choice is None:
                action[slot * width : (slot + 1) * width] = encode_choice(self.choose(sim, job))
        return action


class StaticPolicy(_SetOnArrival):
    name = "static"

    def choose(self, sim: ClusterSimulator, job: Job) -> Choice:
        return Choice.for_gpus(job.requested_gpus, batch=_UNIT)


class TiresiasPolicy(StaticPolicy):
    name = "tiresias"
    queue_order = "las"


class RulesBaseline(_SetOnArrival):
    """The ``rules`` row of ``autotune eval``: on arrival, twice the requested GPUs when
    nothing else waits, bf16 (or fp16 for insensitive models) where the GPU has it, and
    int8 compression when synchronisation takes over 30% of the step. The daemon's rule
    policy (``autotune.policies.rules.RulesPolicy``) decides from a ``ClusterSnapshot``
    with rules of its own."""

    name = "rules"

    def choose(self, sim: ClusterSimulator, job: Job) -> Choice:
        waiting = sum(1 for j in sim.active if not j.running and j is not job)
        gpus = job.requested_gpus
        doubled = min(job.max_gpus, 2 * gpus)
        if waiting == 0 and sim.best_shape(doubled) is not None:
            gpus = doubled
        shape = sim.best_shape(gpus) or sim.best_shape(job.requested_gpus)
        gpu_model = shape.gpu_model if shape else sim.reference_gpu
        peaks = device(gpu_model).peak_tflops
        precision = 0
        if "bf16" in peaks:
            precision = _BF16
        elif "fp16" in peaks and job.model.precision_sensitivity < 0.05:
            precision = _FP16
        choice = Choice.for_gpus(gpus, precision=precision, batch=_UNIT)
        if shape is not None:
            config, batch = job_config(job, choice)
            if config.layout.world_size == shape.world_size:
                step = sim.estimate(job, config, batch, shape, noise_free=True).step
                if step.sync_s > 0.3 * step.step_s:
                    choice = Choice(
                        compression=_INT8,
                        precision=precision,
                        layout=choice.layout,
                        batch=choice.batch,
                    )
        return choice


class RandomPolicy:
    name = "random"
    queue_order = "fifo"

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, env: ClusterEnv, observation: np.ndarray) -> np.ndarray:
        nvec = np.array(ACTION_DIMS * env.slots, dtype=np.int64)
        out: np.ndarray = (self.rng.random(nvec.shape) * nvec).astype(np.int64)
        return out


class OraclePolicy:
    name = "oracle"
    queue_order = "fifo"

    def __init__(self, gain_margin: float = 0.05) -> None:
        self.gain_margin = gain_margin
        grid = itertools.product(
            range(len(COMPRESSIONS)),
            range(len(PRECISIONS)),
            range(len(LAYOUT_MODES)),
            range(len(BATCH_SCALES)),
        )
        self._grid = list(grid)

    def _best_per_gpus(self, sim: ClusterSimulator, job: Job) -> dict[int, tuple[float, Choice]]:
        """For each GPU count the job may take, the best (normalized goodput, choice)."""
        best: dict[int, tuple[float, Choice]] = {}
        for gi, gpus in enumerate(GPU_OPTIONS):
            if gpus < job.min_gpus or gpus > job.max_gpus:
                continue
            shape = sim.best_shape(gpus, exclude=job if job.running else None)
            if shape is None:
                continue
            top = (0.0, Choice.for_gpus(gpus))
            for comp, prec, mode, batch in self._grid:
                choice = Choice(
                    compression=comp,
                    precision=prec,
                    layout=gi * len(LAYOUT_MODES) + mode,
                    batch=batch,
                )
                config, global_batch = job_config(job, choice)
                if config.layout.world_size != gpus:
                    continue
                est = sim.estimate(job, config, global_batch, shape, noise_free=True)
                value = est.goodput / job.reference_goodput
                # Expected loss to divergence in a round: half a round per event.
                value *= 1 - min(1.0, est.divergence_per_hour * sim.config.interval_s / 7200)
                if value > top[0]:
                    top = (value, choice)
            best[gpus] = top
        return best

    def act(self, env: ClusterEnv, observation: np.ndarray) -> np.ndarray:
        sim = _sim(env)
        jobs = sim.active[: env.slots]
        options = [self._best_per_gpus(sim, job) for job in jobs]
        capacity = sim.free_gpus() + sum(j.gpus for j in jobs)
        # Dynamic programming over jobs x GPUs used: the best total normalized goodput.
        value = np.full(capacity + 1, -1.0)
        value[0] = 0.0
        picks: list[dict[int, int]] = []
        for opts in options:
            new = value.copy()  # taking nothing: the job waits
            pick: dict[int, int] = {}
            for used in range(capacity + 1):
                if value[used] < 0:
                    continue
                for gpus, (v, _) in opts.items():
                    total = used + gpus
                    if total <= capacity and value[used] + v > new[total]:
                        new[total] = value[used] + v
                        pick[total] = gpus
            picks.append(pick)
            value = new
        # Walk back from the best total.
        used = int(np.argmax(value))
        chosen: list[int] = [0] * len(jobs)
        for i in range(len(jobs) - 1, -1, -1):
            gpus = picks[i].get(used, 0)
            if gpus and used - gpus >= 0:
                chosen[i] = gpus
                used -= gpus
        action = _keep_all(env)
        width = len(ACTION_DIMS)
        for slot, (job, gpus) in enumerate(zip(jobs, chosen, strict=True)):
            opts = options[slot]
            if gpus == 0:
                # Not worth GPUs this round: keep a running job as it is, queue the rest
                # with the config they would get.
                if job.choice is None and opts:
                    target = max(opts.values(), key=lambda t: t[0])[1]
                    action[slot * width : (slot + 1) * width] = encode_choice(target)
                continue
            new_value, target = opts[gpus]
            if job.running and job.choice is not None:
                current = self._current_value(sim, job)
                lost = sim.config.restart_s / sim.config.interval_s
                if new_value * (1 - lost) <= current * (1 + self.gain_margin):
                    continue
            action[slot * width : (slot + 1) * width] = encode_choice(target)
        return action

    @staticmethod
    def _current_value(sim: ClusterSimulator, job: Job) -> float:
        assert job.choice is not None
        config, batch = job_config(job, job.choice)
        shape = sim.best_shape(job.gpus, exclude=job)
        if shape is None:
            return 0.0
        est = sim.estimate(job, config, batch, shape, noise_free=True)
        return est.goodput / job.reference_goodput


BASELINES: Final[dict[str, Callable[[int], SimPolicy]]] = {
    "static": lambda seed: StaticPolicy(),
    "rules": lambda seed: RulesBaseline(),
    "random": lambda seed: RandomPolicy(seed),
    "tiresias": lambda seed: TiresiasPolicy(),
    "oracle": lambda seed: OraclePolicy(),
}


def make_policy(name: str, seed: int) -> SimPolicy:
    try:
        return BASELINES[name](seed)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(BASELINES)}") from None
