"""Baseline policies for ``autotune eval``. Every one is a daemon ``Policy`` (snapshot in,
per-job choices out) run through the same decision step as the learned policy, in the
environment and in the daemon alike.

- ``rules``: the daemon's rule-based policy (``autotune.policies.rules.RulesPolicy``),
  the very one ``autotune daemon --policy rules`` runs.
- ``static``: the requested GPUs (half the elastic maximum, at least the minimum), data
  parallel (or, where that cannot fit, the rules' first layout that does), fp32, no
  compression, the job's batch; set once, never changed.
- ``random``: a uniformly random action of the learned policy's action space (a lower
  bound).
- ``oracle``: each round, for every job in the policy's window and every GPU count it may
  take, the best configuration of the whole action grid under the noise-free
  performance model with the job's true coefficients (where the GPUs would go now), then
  GPUs shared among the jobs by dynamic programming to maximise the round's total
  normalized goodput; a running job's configuration changes only when the gain pays for
  the restart. An upper bound for one-round decisions, not for whole schedules; it reads
  the simulator (coefficients, reference speeds), which no deployable policy can.
- ``tiresias``: two-queue least-attained-service with preemption, each job on its
  requested GPUs in fp32 (``autotune.policies.tiresias``), as Pollux's artifact runs it.

A study's world adds baselines of its own (``autotune.studies.pollux``: Optimus and
Pollux-style goodput optimisers, the oracle on measured physics).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import numpy as np

from autotune import __version__
from autotune.catalog.devices import device
from autotune.core import JobConfig, JobSpec, NodeInfo, PrecisionMap
from autotune.interfaces import ClusterSnapshot, JobStatus, Policy, PolicyChoice, PolicyRound
from autotune.perf.memory import fit_memory
from autotune.perf.model import Estimate, Shape, shape_of
from autotune.policies.rules import (
    RulesPolicy,
    candidate_nodes,
    first_fitting_layout,
    free_gpus,
)
from autotune.policies.tiresias import TiresiasPolicy
from autotune.rl.action import (
    ACTION_DIMS,
    BATCH_SCALES,
    COMPRESSIONS,
    GPU_OPTIONS,
    LAYOUT_MODES,
    PRECISION_MAPS,
    decode_action,
    slot_config,
)
from autotune.rl.observation import gpu_models, slot_jobs

if TYPE_CHECKING:
    from autotune.envs.cluster_env import ClusterEnv
    from autotune.envs.simulator import SimulatedCluster

__all__ = [
    "BASELINES",
    "OraclePolicy",
    "RandomPolicy",
    "StaticPolicy",
    "make_policy",
    "modelled_value",
    "oracle_choices",
    "shape_for",
    "share_gpus",
]

_UNIT: Final = BATCH_SCALES.index(1.0)


class StaticPolicy:
    name = "static"

    def __init__(self) -> None:
        self.version = f"static-{__version__}"

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        free = free_gpus(snapshot)
        choices: dict[str, PolicyChoice] = {}
        for job in snapshot.by_state("pending"):
            candidates = candidate_nodes(job.spec, snapshot.nodes, free)
            gpus = job.spec.gpu_request()
            if candidates is None:
                continue
            # Data parallel in fp32; where that cannot fit, the rules' first layout that does.
            layout, why, _ = first_fitting_layout(job.spec, gpus, PrecisionMap(), candidates)
            choices[job.spec.job_id] = PolicyChoice(
                config=JobConfig(layout=layout),
                reason=f"static: the requested GPUs in fp32; {why}",
                source="static",
            )
        return PolicyRound(choices=choices)


class RandomPolicy:
    name = "random"

    def __init__(self, seed: int, slots: int = 32) -> None:
        self.rng = np.random.default_rng(seed)
        self.slots = slots
        self.version = f"random-{__version__}"

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        nvec = np.array(ACTION_DIMS * self.slots, dtype=np.int64)
        action = (self.rng.random(nvec.shape) * nvec).astype(np.int64)
        return PolicyRound(choices=decode_action(action, snapshot, self.slots, source="random"))


def shape_for(
    spec: JobSpec, gpus: int, free: dict[str, int], nodes: Sequence[NodeInfo]
) -> Shape | None:
    """Where ``gpus`` GPUs of one model would go now: the fastest allowed model with
    room, packed onto as few nodes as possible."""
    for model in gpu_models(nodes):
        if not spec.allows(model):
            continue
        pool = sorted(
            (n for n in nodes if n.gpu_model == model and free.get(n.node_id, 0) > 0),
            key=lambda n: (-free[n.node_id], n.node_id),
        )
        if spec.max_nodes == 1:
            pool = [n for n in pool if free[n.node_id] >= gpus][:1]
        if sum(free[n.node_id] for n in pool) < gpus:
            continue
        fits = [n for n in pool if free[n.node_id] >= gpus]
        if fits:
            best = min(fits, key=lambda n: (free[n.node_id], n.node_id))
            return Shape(
                gpu_model=model,
                ranks_per_node=(gpus,),
                inter_node_gbps=best.inter_node_bandwidth_gbps,
            )
        per_node: list[int] = []
        used: list[NodeInfo] = []
        left = gpus
        for n in pool:
            take = min(left, free[n.node_id])
            per_node.append(take)
            used.append(n)
            left -= take
            if left == 0:
                break
        return Shape(
            gpu_model=model,
            ranks_per_node=tuple(per_node),
            inter_node_gbps=min(n.inter_node_bandwidth_gbps for n in used),
        )
    return None


def modelled_value(
    sim: SimulatedCluster, spec: JobSpec, config: JobConfig, shape: Shape
) -> tuple[float, JobConfig, Estimate]:
    """What the simulator's noise-free model says of ``config`` on ``shape`` after the
    memory rule for that GPU: normalized goodput (goodput / the job's reference goodput,
    0 when it runs out of memory), the fitted config and the estimate. What the oracle
    optimises and what the ``tune`` baseline's trials measure."""
    assert spec.model is not None
    memory = device(shape.gpu_model).memory_bytes
    fitted = fit_memory(spec.model, config, config.batch(spec), memory)[0]
    est = sim.estimate_for(spec.job_id, fitted, shape)
    return est.goodput / sim.reference_goodput(spec.job_id), fitted, est


class OraclePolicy:
    name = "oracle"

    def __init__(self, env: ClusterEnv, *, slots: int = 32, gain_margin: float = 0.05) -> None:
        self.env = env
        self.slots = slots
        self.gain_margin = gain_margin
        self.version = f"oracle-{__version__}"
        self._grid = list(
            itertools.product(
                range(len(COMPRESSIONS)),
                range(len(PRECISION_MAPS)),
                range(len(LAYOUT_MODES)),
                range(len(BATCH_SCALES)),
            )
        )
        self._best: dict[tuple[str, int, Shape], tuple[float, JobConfig | None]] = {}

    def _at_risk(self, value: float, est: Estimate) -> float:
        """``value`` less the expected loss to divergence in a round (half a round per
        event)."""
        return value * (1 - min(1.0, est.divergence_per_hour * self.env.round_s / 7200))

    def _best_for(
        self, job: JobStatus, gpus: int, shape: Shape, nodes: Sequence[NodeInfo]
    ) -> tuple[float, JobConfig | None]:
        key = (job.spec.job_id, gpus, shape)
        hit = self._best.get(key)
        if hit is not None:
            return hit
        sim = self.env.sim
        assert sim is not None
        gi = max(i for i, g in enumerate(GPU_OPTIONS) if g <= gpus)
        best: tuple[float, JobConfig | None] = (0.0, JobConfig.data_parallel(gpus))
        for comp, prec, mode, batch in self._grid:
            config = slot_config(job.spec, (comp, prec, gi, mode, batch, 0))
            # What the executor refuses, the decision step would swap for another
            # compression (``RUNNABLE_COMPRESSION``) than the one valued here.
            if config.world_size != gpus or config.executor_refusal() is not None:
                continue
            value, fitted, est = modelled_value(sim, job.spec, config, shape)
            value = self._at_risk(value, est)
            if value > best[0]:
                best = (value, fitted)
        self._best[key] = best
        return best

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        nodes = [n for n in snapshot.nodes if n.gpu_count > 0]
        jobs = slot_jobs(snapshot, self.slots)
        free = free_gpus(snapshot)
        lost = self.env.sim_config.restart_s / self.env.round_s
        options: list[dict[int, tuple[float, JobConfig | None]]] = []
        for job in jobs:
            own = dict(free)
            if job.placement is not None:
                for slot in job.placement.ranks:
                    own[slot.node_id] += 1
            best: dict[int, tuple[float, JobConfig | None]] = {}
            for gpus in GPU_OPTIONS:
                if not job.spec.min_gpus <= gpus <= job.spec.max_gpus:
                    continue
                shape = shape_for(job.spec, gpus, own, nodes)
                if shape is not None:
                    best[gpus] = self._best_for(job, gpus, shape, nodes)
            if job.state == "running" and job.config is not None and job.placement is not None:
                # A change pays the restart; keeping (config None) is worth what runs now,
                # unless a change gains more than the margin.
                best = {g: (v * (1 - lost), c) for g, (v, c) in best.items()}
                held = job.placement.world_size
                current = self._current(job, nodes)
                if best.get(held, (0.0, None))[0] <= current * (1 + self.gain_margin):
                    best[held] = (current, None)
                if not best:
                    best[held] = (current, None)
            options.append(best)
        capacity = sum(max(0, f) for f in free.values()) + sum(
            j.placement.world_size for j in jobs if j.placement is not None
        )
        running = [j.state == "running" and j.placement is not None for j in jobs]
        chosen = share_gpus(options, capacity, running)
        return PolicyRound(
            choices=oracle_choices(
                snapshot, jobs, options, chosen, lambda v: f"oracle: {v:.2f} normalized goodput"
            )
        )

    def _current(self, job: JobStatus, nodes: Sequence[NodeInfo]) -> float:
        assert job.config is not None
        assert job.placement is not None
        shape = shape_of(job.placement, {n.node_id: n for n in nodes})
        sim = self.env.sim
        assert sim is not None
        est = sim.estimate_for(job.spec.job_id, job.config, shape)
        return self._at_risk(est.goodput / sim.reference_goodput(job.spec.job_id), est)


def oracle_choices(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobStatus],
    options: Sequence[dict[int, tuple[float, JobConfig | None]]],
    chosen: Sequence[int],
    describe: Callable[[float], str],
) -> dict[str, PolicyChoice]:
    """The oracle's choices from the GPUs ``share_gpus`` chose per slot job: its config at
    that count (none where it keeps its own), a wait (a preemption for a running job) at
    0, and a wait for every job outside the slots."""
    choices: dict[str, PolicyChoice] = {}
    for job, opts, gpus in zip(jobs, options, chosen, strict=True):
        if gpus == 0:
            choices[job.spec.job_id] = PolicyChoice(
                config=None,
                reason="oracle: not worth GPUs this round",
                preempt=job.state == "running",
            )
            continue
        value, config = opts[gpus]
        if config is not None:  # None: it keeps its configuration
            choices[job.spec.job_id] = PolicyChoice(config=config, reason=describe(value))
    for job in snapshot.by_state("pending"):
        choices.setdefault(
            job.spec.job_id, PolicyChoice(config=None, reason="oracle: outside the window")
        )
    return choices


def share_gpus(
    options: Sequence[dict[int, tuple[float, JobConfig | None]]],
    capacity: int,
    required: Sequence[bool],
) -> list[int]:
    """GPUs per job maximising the summed value within ``capacity`` (dynamic programming
    over jobs x GPUs used); 0: the job waits, which a ``required`` (running) job may not."""
    value = np.full(capacity + 1, -1.0)
    value[0] = 0.0
    picks: list[dict[int, int]] = []
    for opts, must in zip(options, required, strict=True):
        new = np.full(capacity + 1, -1.0) if must else value.copy()  # copy: it waits
        pick: dict[int, int] = {}
        for start in np.nonzero(value >= 0)[0].tolist():
            for gpus, (v, _) in opts.items():
                total = start + gpus
                if total <= capacity and value[start] + v > new[total]:
                    new[total] = value[start] + v
                    pick[total] = gpus
        if must and not (new >= 0).any():
            new = value.copy()  # cannot hold it (the cluster shrank): leave it as it is
        picks.append(pick)
        value = new
    used = int(np.argmax(value))
    chosen = [0] * len(options)
    for i in range(len(options) - 1, -1, -1):
        gpus = picks[i].get(used, 0)
        if gpus and used - gpus >= 0:
            chosen[i] = gpus
            used -= gpus
    return chosen


BASELINES: Final[dict[str, Callable[[ClusterEnv, int], Policy]]] = {
    "static": lambda env, seed: StaticPolicy(),
    "rules": lambda env, seed: RulesPolicy(),
    "random": lambda env, seed: RandomPolicy(seed, slots=env.slots),
    "oracle": lambda env, seed: OraclePolicy(env, slots=env.slots),
    "tiresias": lambda env, seed: TiresiasPolicy(),
}


def make_policy(name: str, env: ClusterEnv, seed: int) -> Policy:
    try:
        return BASELINES[name](env, seed)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(BASELINES)}") from None
