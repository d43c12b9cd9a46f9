"""``tune``: a trial-based autotuner baseline in the style of DeepSpeed's autotuning.

A daemon ``Policy`` for ``autotune eval`` (it reads the simulated cluster of the
``ClusterEnv`` it runs in, as the oracle does). When a waiting job in the policy's window
(the first ``env.slots`` active jobs in queue order) first has GPUs to be profiled on
(some GPU count of its range fits the free GPUs now), it is profiled under
a sequence of configurations that a Ray Tune search algorithm proposes (Optuna's TPE
through ``ray.tune.search.optuna.OptunaSearch``, or random search with
``searcher="random"``) over the learned policy's grid (``autotune.envs.spaces.slot_config``:
compression, precision map, GPU count within the job's bounds, layout mode, batch scale;
no activation checkpointing beyond what the memory rule adds). There are
``budget_s // trial_s`` trials (at least one). Each trial measures the job's normalized
goodput (goodput / reference goodput) under the simulator's noise-free performance model,
on the GPUs the configuration would get now (``autotune.policies.baselines.shape_for``:
the fastest allowed GPU model with room, as few nodes as possible), times log-normal
measurement noise (``noise`` sigma). The memory rule (``autotune.perf.memory.fit_memory``
for that GPU's memory) is applied first; a configuration that still runs out of memory,
or whose GPU count has no room now, scores 0. The best configuration is kept for the
job's whole life: it is the job's choice while it waits (the Planner starts it when it
fits) and the job is never reconfigured. When every trial scores 0 the job keeps the
requested GPUs (half its elastic maximum, at least its minimum), data parallel, fp32.

The trial time is not free (``charge``): the job pays ``budget_s`` of downtime when it
first starts, as the profiling runs occupy its GPUs before it trains. It is added to the
simulated job's ``downtime_s`` when the job is tuned; the simulator serves a job's
downtime only while it runs, so a waiting job keeps it until it starts (the environment's
reward then counts it with the restart downtime). ``charge=False``: profiling is free,
an upper bound for the approach.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from autotune import __version__
from autotune.core import MILLI_PER_GPU, JobConfig, JobSpec, NodeInfo
from autotune.envs.simulator import SimulatedCluster
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice, PolicyRound
from autotune.perf.model import Shape
from autotune.policies.baselines import modelled_value, shape_for
from autotune.policies.rules import free_gpus
from autotune.rl.action import (
    BATCH_SCALES,
    COMPRESSIONS,
    GPU_OPTIONS,
    LAYOUT_MODES,
    PRECISION_MAPS,
    slot_config,
    wait_choices,
)

if TYPE_CHECKING:
    from autotune.envs.cluster_env import ClusterEnv

__all__ = ["TrialTunerPolicy"]

_METRIC: Final = "goodput"


def _gpu_choices(spec: JobSpec) -> list[int]:
    """Indices of ``GPU_OPTIONS`` within the job's bounds (``slot_config`` clips the
    others to them); index 0 (clipped to the minimum) when none is."""
    return [i for i, g in enumerate(GPU_OPTIONS) if spec.min_gpus <= g <= spec.max_gpus] or [0]


def _space(spec: JobSpec) -> dict[str, Any]:
    from ray import tune

    return {
        "compression": tune.choice(list(range(len(COMPRESSIONS)))),
        "precision": tune.choice(list(range(len(PRECISION_MAPS)))),
        "gpus": tune.choice(_gpu_choices(spec)),
        "mode": tune.choice(list(range(len(LAYOUT_MODES)))),
        "batch": tune.choice(list(range(len(BATCH_SCALES)))),
    }


class TrialTunerPolicy:
    """See the module docstring. ``trials`` counts the trials run per job, ``chosen``
    holds each tuned job's configuration and ``scores`` its best measured normalized
    goodput."""

    name = "tune"

    def __init__(
        self,
        env: ClusterEnv,
        *,
        budget_s: float = 1800.0,
        trial_s: float = 120.0,
        noise: float = 0.05,
        seed: int = 0,
        searcher: str = "optuna",
        charge: bool = True,
    ) -> None:
        if budget_s < 0:
            raise ValueError(f"budget_s={budget_s!r}: must be >= 0")
        if not trial_s > 0:
            raise ValueError(f"trial_s={trial_s!r}: must be > 0")
        if searcher not in ("optuna", "random"):
            raise ValueError(f"searcher {searcher!r}: optuna or random")
        self.env = env
        self.budget_s = budget_s
        self.trial_s = trial_s
        self.noise = noise
        self.seed = seed
        self.searcher = searcher
        self.charge = charge
        """Delay each job by its trial budget (``False``: profiling is free, an upper
        bound for the approach)."""
        self.version = f"tune-{searcher}-{__version__}"
        self.rng = np.random.default_rng(seed)
        self.trials: dict[str, int] = {}
        """Trials run per job."""
        self.chosen: dict[str, JobConfig] = {}
        self.scores: dict[str, float] = {}
        self._sim: SimulatedCluster | None = None

    @property
    def n_trials(self) -> int:
        return max(1, int(self.budget_s // self.trial_s))

    # -- Policy -------------------------------------------------------------------------

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        sim = self.env.sim
        if sim is None:
            raise RuntimeError("reset the environment first")
        if sim is not self._sim:  # a new episode: new jobs under possibly the same ids
            self._sim = sim
            self.trials.clear()
            self.chosen.clear()
            self.scores.clear()
        nodes = [n for n in snapshot.nodes if n.gpu_count > 0]
        free = free_gpus(snapshot)
        active = snapshot.queue_order()
        choices: dict[str, PolicyChoice] = {}
        for job in active[: self.env.slots]:
            if job.state != "pending":
                continue  # running: it keeps the configuration it started with
            job_id = job.spec.job_id
            if job_id not in self.chosen and self._has_room(job.spec, free, nodes):
                self._tune(sim, job, free, nodes)
            config = self.chosen.get(job_id)
            if config is None:
                choices[job_id] = PolicyChoice(
                    config=None, reason="tune: waiting for free GPUs to profile on"
                )
            else:
                # The Planner places jobs in queue order: the GPUs this one would take
                # now are not there for the jobs behind it.
                shape = shape_for(job.spec, config.world_size, free, nodes)
                if shape is not None:
                    _reserve(shape, free, nodes)
                choices[job_id] = PolicyChoice(
                    config=config,
                    reason=(
                        f"tune: best of {self.trials[job_id]} trials "
                        f"({self.scores[job_id]:.2f} normalized goodput measured): "
                        f"{config.describe()}"
                    ),
                    features={"trials": float(self.trials[job_id])},
                )
        choices.update(wait_choices(active, self.env.slots))
        return PolicyRound(choices=choices)

    # -- tuning -------------------------------------------------------------------------

    @staticmethod
    def _has_room(spec: JobSpec, free: dict[str, int], nodes: list[NodeInfo]) -> bool:
        if spec.gpu_milli < MILLI_PER_GPU:
            counts = {1}
        else:
            counts = {
                min(max(GPU_OPTIONS[i], spec.min_gpus), spec.max_gpus) for i in _gpu_choices(spec)
            }
        return any(shape_for(spec, gpus, free, nodes) is not None for gpus in counts)

    def _tune(
        self, sim: SimulatedCluster, job: JobStatus, free: dict[str, int], nodes: list[NodeInfo]
    ) -> None:
        spec = job.spec
        job_id = spec.job_id
        searcher = self._make_searcher(spec)
        best = (0.0, JobConfig.data_parallel(spec.gpu_request()))
        runs = 0
        for i in range(self.n_trials):
            trial_id = f"{job_id}-{i}"
            params = searcher.suggest(trial_id)
            if params is None:  # the searcher has nothing more to propose
                break
            config = slot_config(
                spec,
                (
                    int(params["compression"]),
                    int(params["precision"]),
                    int(params["gpus"]),
                    int(params["mode"]),
                    int(params["batch"]),
                    0,
                ),
            )
            value, fitted = self._trial(sim, spec, config, free, nodes)
            searcher.on_trial_complete(trial_id, {_METRIC: value})
            runs += 1
            if value > best[0]:
                best = (value, fitted)
        self.trials[job_id] = runs
        self.scores[job_id] = best[0]
        self.chosen[job_id] = best[1]
        if self.charge:  # the profiling runs delay the job's real start
            # Served from the round it starts in: the simulator counts a job's downtime
            # down only while it runs.
            sim.jobs[job_id].downtime_s += self.budget_s

    def _trial(
        self,
        sim: SimulatedCluster,
        spec: JobSpec,
        config: JobConfig,
        free: dict[str, int],
        nodes: list[NodeInfo],
    ) -> tuple[float, JobConfig]:
        """One trial's measured normalized goodput, and the config after the memory
        rule."""
        shape = shape_for(spec, config.world_size, free, nodes)
        if shape is None:
            return 0.0, config
        value, fitted, est = modelled_value(sim, spec, config, shape)
        if est.oom:
            return 0.0, fitted
        return float(value * self.rng.lognormal(0.0, self.noise)), fitted

    def _make_searcher(self, spec: JobSpec) -> Any:
        seed = int.from_bytes(
            hashlib.blake2b(f"{self.seed}:{spec.job_id}".encode(), digest_size=4).digest(), "big"
        )
        if self.searcher == "random":
            return _RandomSearcher(spec, seed)
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("ray.tune.search.optuna").setLevel(logging.ERROR)
        return OptunaSearch(
            space=_space(spec),
            metric=_METRIC,
            mode="max",
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
        )


def _reserve(shape: Shape, free: dict[str, int], nodes: list[NodeInfo]) -> None:
    """Take a shape's GPUs out of ``free``: each node's share on the node of its GPU
    model with the least room that holds it."""
    for count in sorted(shape.ranks_per_node, reverse=True):
        fits = [
            n for n in nodes if n.gpu_model == shape.gpu_model and free.get(n.node_id, 0) >= count
        ]
        if fits:
            node = min(fits, key=lambda n: (free[n.node_id], n.node_id))
            free[node.node_id] -= count


class _RandomSearcher:
    """Uniform random configs (Ray Tune's random search without its driver)."""

    def __init__(self, spec: JobSpec, seed: int) -> None:
        self.space = _space(spec)
        self.rng = np.random.default_rng(seed)

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {k: v.sample(random_state=self.rng) for k, v in self.space.items()}

    def on_trial_complete(self, trial_id: str, result: dict[str, float]) -> None:
        return None
