"""``tune``: a trial-based autotuner baseline in the style of DeepSpeed's autotuning.

When a job arrives it is profiled under a sequence of configurations that a Ray Tune
search algorithm proposes (Optuna's TPE through ``ray.tune.search.optuna.OptunaSearch``,
or random search with ``searcher="random"``); each trial is a short run of ``trial_s``
simulated seconds on the GPUs the config would get now, measuring the job's goodput
with the simulator's physics plus measurement noise (log-normal, ``noise`` sigma). After
``budget_s`` of trial time the best config is kept for the job's whole life.

The trial time is not free: the job starts ``budget_s`` later in effect (it is added to
its restart downtime), as the profiling runs occupy its GPUs. A config that runs out of
memory scores 0.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Final

import numpy as np

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

__all__ = ["TrialTunerPolicy"]

_METRIC: Final = "goodput"


def _space(job: Job) -> dict[str, Any]:
    from ray import tune

    gpus = [i for i, g in enumerate(GPU_OPTIONS) if job.min_gpus <= g <= job.max_gpus] or [0]
    return {
        "compression": tune.choice(list(range(len(COMPRESSIONS)))),
        "precision": tune.choice(list(range(len(PRECISIONS)))),
        "gpus": tune.choice(gpus),
        "mode": tune.choice(list(range(len(LAYOUT_MODES)))),
        "batch": tune.choice(list(range(len(BATCH_SCALES)))),
    }


class TrialTunerPolicy:
    name = "tune"
    queue_order = "fifo"

    def __init__(
        self,
        *,
        budget_s: float = 1800.0,
        trial_s: float = 120.0,
        noise: float = 0.05,
        seed: int = 0,
        searcher: str = "optuna",
        charge: bool = True,
    ) -> None:
        self.budget_s = budget_s
        self.trial_s = trial_s
        self.noise = noise
        self.seed = seed
        self.searcher = searcher
        self.charge = charge
        """Delay each job by its trial time (``False``: profiling is free, an upper
        bound for the approach)."""
        self.rng = np.random.default_rng(seed)
        self.trials: dict[str, int] = {}
        """Trials run per job."""

    @property
    def n_trials(self) -> int:
        return max(1, int(self.budget_s // self.trial_s))

    def _make_searcher(self, job: Job) -> Any:
        seed = int.from_bytes(
            hashlib.blake2b(f"{self.seed}:{job.job_id}".encode(), digest_size=4).digest(), "big"
        )
        if self.searcher == "optuna":
            import optuna
            from ray.tune.search.optuna import OptunaSearch

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            logging.getLogger("ray.tune.search.optuna").setLevel(logging.ERROR)
            return OptunaSearch(
                space=_space(job),
                metric=_METRIC,
                mode="max",
                sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
            )
        if self.searcher == "random":
            return _RandomSearcher(job, seed)
        raise ValueError(f"searcher {self.searcher!r}: optuna or random")

    def _trial(self, sim: ClusterSimulator, job: Job, choice: Choice) -> float:
        config, batch = job_config(job, choice)
        shape = sim.best_shape(config.layout.world_size, exclude=job if job.running else None)
        if shape is None:
            return 0.0
        est = sim.estimate(job, config, batch, shape)
        if est.oom:
            return 0.0
        value = est.goodput / job.reference_goodput
        return float(value * self.rng.lognormal(0.0, self.noise))

    def choose(self, sim: ClusterSimulator, job: Job) -> Choice:
        searcher = self._make_searcher(job)
        best = (-1.0, Choice.for_gpus(job.requested_gpus))
        for i in range(self.n_trials):
            trial_id = f"{job.job_id}-{i}"
            params = searcher.suggest(trial_id)
            if params is None:  # the space is exhausted
                break
            choice = Choice(
                compression=int(params["compression"]),
                precision=int(params["precision"]),
                layout=int(params["gpus"]) * len(LAYOUT_MODES) + int(params["mode"]),
                batch=int(params["batch"]),
            )
            value = self._trial(sim, job, choice)
            searcher.on_trial_complete(trial_id, {_METRIC: value})
            if value > best[0]:
                best = (value, choice)
        self.trials[job.job_id] = self.n_trials
        if self.charge:  # the profiling runs delay the job's real start
            job.downtime_s += self.n_trials * self.trial_s
        return best[1]

    def act(self, env: ClusterEnv, observation: np.ndarray) -> np.ndarray:
        sim = env.sim
        if sim is None:
            raise RuntimeError("reset the environment first")
        width = len(ACTION_DIMS)
        action = np.zeros(width * env.slots, dtype=np.int64)
        for slot, job in enumerate(sim.active[: env.slots]):
            if job.choice is None:  # set once: the simulator keeps it from then on
                action[slot * width : (slot + 1) * width] = encode_choice(self.choose(sim, job))
        return action


class _RandomSearcher:
    """Uniform random configs (Ray Tune's random search without its driver)."""

    def __init__(self, job: Job, seed: int) -> None:
        self.space = _space(job)
        self.rng = np.random.default_rng(seed)

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {k: v.sample(random_state=self.rng) for k, v in self.space.items()}

    def on_trial_complete(self, trial_id: str, result: dict[str, float]) -> None:
        return None
