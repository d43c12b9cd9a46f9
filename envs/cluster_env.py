"""``ClusterEnv``: the training cluster as a Gymnasium environment.

## Description

A thin shell over the simulated cluster that ``autotune daemon --backend sim`` runs
(``autotune.envs.simulator``). Each step is one decision round, exactly as a daemon tick:
the action is decoded into per-job choices (``autotune.rl.action.decode_action``), the
decision step (``autotune.decision.step.decide``: memory rule, Hungarian Planner) turns
them into decisions, the simulated cluster applies them and runs ``round_s`` simulated
seconds. Jobs arrive, queue, train and finish.

## Action space

``MultiDiscrete([2, 6, 5, 7, 3, 4, 2] * slots)``; per slot (the first ``slots`` active
jobs in queue order):

| entry | values |
|---|---|
| change | 1 reconfigure a running job now, 0 keep it (a waiting job is always configured) |
| compression | none, top-k 10%, top-k 1%, int8, fp8, PowerSGD rank 4 |
| precision | fp32, bf16, fp16, bf16 with fp8 feed-forward, fp8 matmuls |
| gpus | 1, 2, 4, 8, 16, 32, 64 (clipped to the job's min..max) |
| mode | data parallel, x tensor-parallel 2, x pipeline 2 |
| batch | 0.5, 1, 2, 4 x the job's global batch |
| checkpointing | off, on (the memory rule may still turn it on) |

An entry out of its range raises ``InvalidActionError``. Waiting jobs beyond the slots
wait in queue order. A study's world may act through other knobs with a wrapper of its
own (``autotune.studies.pollux.env.PolluxCompatEnv``: each job's weight in a goodput
allocation).

## Observation space

``Box(0, 1, (38 + 22 * slots,), float32)``; every entry is bounded as listed
(``autotune.rl.observation.FEATURES`` is the same table):

| index | feature | range | meaning |
|---|---|---|---|
| 0 | pending | [0, 1] | waiting jobs, log(1+n)/log(1001), capped at 1 |
| 1 | running | [0, 1] | running jobs, log(1+n)/log(1001), capped at 1 |
| 2 | beyond_window | [0, 1] | share of active jobs outside the slots |
| 3 | busy | [0, 1] | share of the cluster's GPUs held now |
| 4 | busy_last | [0, 1] | share held at the previous decision |
| 5 | arrival_15 | [0, 1] | probability that new GPU demand arrives within 15 minutes |
| 6 | arrival_60 | [0, 1] | probability that new GPU demand arrives within 60 minutes |
| 7 | headroom | [0, 1] | free GPU share if demand reaches its next-hour peak (95% quantile) |
| 8 | round | [0, 1] | the decision round period, log10(1 + s)/5, capped at 1 |
| 9 | restart | [0, 1] | restart cost / round period r as (log10(r) + 2)/4, capped: r = 0.1 is .25 |
| 10+7m | gpu{m}.present | [0, 1] | 1 if the cluster has GPU model m (m = 0..3, fastest first) |
| 11+7m | gpu{m}.total | [0, 1] | its GPUs / the cluster's GPUs |
| 12+7m | gpu{m}.free | [0, 1] | its free GPUs / the cluster's GPUs |
| 13+7m | gpu{m}.memory | [0, 1] | memory of one GPU / 192 GiB |
| 14+7m | gpu{m}.bf16 | [0, 1] | 1 if it has bf16 units faster than fp32 |
| 15+7m | gpu{m}.fp8 | [0, 1] | 1 if it has fp8 units faster than its 16-bit ones |
| 16+7m | gpu{m}.speed | [0, 1] | its fastest 16-bit (else fp32) peak / the fastest model's |
| 38+22k | slot[k].occupied | [0, 1] | 1 if a job is in slot k |
| 39+22k | slot[k].running | [0, 1] | 1 if it runs |
| 40+22k | slot[k].waiting | [0, 1] | hours waiting since submission, log(1+h)/log(101), capped |
| 41+22k | slot[k].parameters | [0, 1] | log10(parameters)/12 |
| 42+22k | slot[k].flops | [0, 1] | log10(FLOPs per sample)/16 |
| 43+22k | slot[k].transformer | [0, 1] | 1 for a transformer (tensor parallelism possible) |
| 44+22k | slot[k].min_gpus | [0, 1] | log2(min GPUs)/6 |
| 45+22k | slot[k].max_gpus | [0, 1] | log2(max GPUs)/6 |
| 46+22k | slot[k].memory_need | [0, 1] | one rank's bytes (1 GPU, bf16, job's batch) / 4x192 GiB |
| 47+22k | slot[k].gpus | [0, 1] | log2(1 + GPUs held)/log2(65) |
| 48+22k | slot[k].compression | [0, 1] | current compression option / 5 |
| 49+22k | slot[k].precision | [0, 1] | current precision option / 4 |
| 50+22k | slot[k].mode | [0, 1] | current layout mode / 2 |
| 51+22k | slot[k].batch | [0, 1] | current batch-scale option / 3 |
| 52+22k | slot[k].checkpointing | [0, 1] | 1 if activation checkpointing is on |
| 53+22k | slot[k].accumulation | [0, 1] | log2(micro-batches)/6 |
| 54+22k | slot[k].hardware_efficiency | [0, 1] | samples/s over the compute-bound rate |
| 55+22k | slot[k].statistical_efficiency | [0, 1] | of the current batch, compression, precision |
| 56+22k | slot[k].progress | [0, 1] | share of the job's work done |
| 57+22k | slot[k].gpu_model | [0, 1] | (index of the GPU model it runs on + 1) / 4; 0 if none |
| 58+22k | slot[k].tenant_quota | [0, 1] | its tenant's GPU quota / the cluster's GPUs; 0 if none |
| 59+22k | slot[k].tenant_headroom | [0, 1] | 0.5 + (its tenant's quota - GPUs held) / 2 / GPUs |

## Rewards

Sum over running jobs of goodput / the job's reference goodput (its reference GPUs,
data parallel, fp32), averaged over the round; minus ``oom_penalty`` per job whose
configuration ran out of memory, ``nan_penalty`` per divergence event,
``restart_penalty`` times the job-rounds lost to reconfiguration downtime, and
``energy_weight`` per kWh the cluster drew (running jobs' power from the performance
model, idle GPUs at their idle share).

## Starting state

An empty cluster; jobs from ``jobs`` (a trace), or drawn from ``self.np_random``: with
``stream=True`` the daemon's own built-in job stream (``initial_jobs`` waiting at the
start, then Poisson arrivals every ``mean_interarrival_s``, ``n_jobs`` in all), else a
trace-like synthetic workload with log-normal durations.

``reset(options={"restart_s": s})`` makes a reconfiguration cost ``s`` seconds from
that episode on (a training mixture draws one per episode, so that the policy learns
what the observation's ``restart`` feature means).

## Episode end

Terminated when every job has finished; truncated after ``max_steps``.

## Arguments

``ClusterEnv(config, *, nodes, jobs, forecaster, provisioner, tenants, **fields)``: an
``EnvConfig`` (every field documented there, with its default), its fields overridden
by keyword; the cluster's ``nodes`` (default: ``EnvConfig.small``'s preset), the
``jobs`` (a trace, or a function returning one per episode; default: drawn), the demand
``forecaster`` behind the observation's forecast features, a ``provisioner`` and the
``tenants`` whose quotas the decision step enforces (``SimConfig.tenants``; default:
none, no quota).
``gymnasium.make("autotune/Cluster-v0")`` (the daemon's default world: its 32 GPUs of
three generations and its job stream; 16 slots) or ``"autotune/ClusterSmall-v0"`` (16
GPUs, 4 slots, short synthetic episodes); keyword arguments override either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from autotune.core import NodeInfo, TenantSpec
from autotune.decision.step import decide
from autotune.demand import DemandForecaster
from autotune.envs.presets import default_nodes, small_nodes
from autotune.envs.simulator import Arrival, SimConfig, SimulatedCluster
from autotune.envs.spaces import action_space, observation_space
from autotune.envs.workloads import job_stream, synthetic_jobs
from autotune.interfaces import ClusterSnapshot, PolicyChoice
from autotune.perf.sensitivity import measured_spread
from autotune.provisioning import Provisioner
from autotune.rl.action import decode_action
from autotune.rl.environment import EnvConfig
from autotune.rl.observation import ObservationEncoder
from autotune.rl.reward import RoundOutcome, reward

__all__ = ["ClusterEnv", "EnvConfig"]


class ClusterEnv(gym.Env[np.ndarray, np.ndarray]):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's convention

    def __init__(
        self,
        config: EnvConfig | None = None,
        *,
        nodes: Sequence[NodeInfo] | None = None,
        jobs: Sequence[Arrival] | Callable[[], Sequence[Arrival]] | None = None,
        forecaster: DemandForecaster | None = None,
        provisioner: Provisioner | None = None,
        tenants: Sequence[TenantSpec] = (),
        **fields: Any,
    ) -> None:
        """``config`` with ``fields`` (any ``EnvConfig`` field, by name) replaced; see the
        module docstring's Arguments."""
        self.config = replace(config or EnvConfig(), **fields)
        config = self.config
        if nodes is not None:
            self.nodes = list(nodes)
        else:
            self.nodes = small_nodes() if config.small else default_nodes()
        self._jobs = jobs
        self.slots = config.slots
        self.sim_config = SimConfig(
            round_s=config.round_s,
            restart_s=config.restart_s,
            start_s=config.start_s,
            noise=config.noise,
            nodes=tuple(self.nodes),
            initial_jobs=0,
            max_jobs=0,
            wake_s=config.wake_s,
            tenants=tuple(tenants),
            mix_models=config.mix_models,
            pack_jobs=config.pack_jobs,
            sensitivity=measured_spread() if config.drawn_sensitivity else None,
        )
        self.provisioner = provisioner
        """Parks and wakes nodes every round (``autotune.provisioning``); with one, idle
        rounds are played (not skipped), so idle energy counts."""
        self.max_steps = config.max_steps
        self.encoder = ObservationEncoder(
            config.slots,
            round_s=config.round_s,
            restart_s=config.restart_s,
            forecaster=forecaster,
        )
        self.action_space: Any = action_space(config.slots)
        self.observation_space = observation_space(config.slots)
        self.sim: SimulatedCluster | None = None
        self.snapshot: ClusterSnapshot | None = None
        self.steps = 0

    @property
    def forecaster(self) -> DemandForecaster | None:
        return self.encoder.forecaster

    @property
    def round_s(self) -> float:
        return self.sim_config.round_s

    # -- Gymnasium API ------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "restart_s" in options:
            # SimConfig refuses a negative cost.
            self.sim_config = replace(self.sim_config, restart_s=float(options["restart_s"]))
            self.encoder.restart_s = self.sim_config.restart_s
        if callable(self._jobs):
            jobs = list(self._jobs())
        elif self._jobs is not None:
            jobs = list(self._jobs)
        else:
            config = self.config
            jobs = (
                list(
                    job_stream(
                        self.np_random,
                        mean_interarrival_s=config.mean_interarrival_s,
                        initial_jobs=config.initial_jobs,
                        max_jobs=config.n_jobs,
                    )
                )
                if config.stream
                else synthetic_jobs(
                    self.np_random,
                    n_jobs=config.n_jobs,
                    mean_interarrival_s=config.mean_interarrival_s,
                    median_duration_s=config.median_duration_s,
                )
            )
        self.sim = SimulatedCluster(self.sim_config, arrivals=jobs, rng=self.np_random)
        self.sim.skip_idle()
        self.steps = 0
        self.encoder.reset()
        if self.provisioner is not None:
            self.provisioner.reset()
        self.snapshot = self._provisioned(self.sim)
        return self.encoder.encode(self.snapshot), self._info(None, {})

    def choices(self, action: np.ndarray) -> dict[str, PolicyChoice]:
        """What ``action`` means for the current state (``InvalidActionError`` if out of
        range)."""
        return decode_action(action, self._snapshot(), self.slots, source="action")

    def step(
        self, action: np.ndarray
    ) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        return self.step_choices(self.choices(action))

    def step_choices(
        self, choices: Mapping[str, PolicyChoice]
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One round with choices made directly (how baselines that are daemon
        ``Policy`` objects run in the environment)."""
        sim = self._require()
        snapshot = self._snapshot()
        round_ = decide(snapshot, choices, {}, honoured={}, policy_version="env", explain=False)
        sim.apply(round_.decisions)
        outcome = sim.advance()
        if self.provisioner is None:
            sim.skip_idle()
        self.steps += 1
        self.snapshot = self._provisioned(sim)
        value, parts = reward(outcome, round_s=self.round_s, weights=self.config.reward_weights)
        terminated = sim.done
        truncated = not terminated and self.steps >= self.max_steps
        obs = self.encoder.encode(self.snapshot)
        return obs, value, terminated, truncated, self._info(outcome, parts)

    # -- helpers ------------------------------------------------------------------------

    def _provisioned(self, sim: SimulatedCluster) -> ClusterSnapshot:
        """The snapshot the next decision sees, after the provisioner's plan."""
        snapshot = sim.snapshot()
        if self.provisioner is None:
            return snapshot
        plan = self.provisioner.plan(snapshot)
        if not plan.park and not plan.wake:
            return snapshot
        sim.park(plan.park)
        sim.wake(plan.wake)
        return sim.snapshot()

    def _require(self) -> SimulatedCluster:
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        return self.sim

    def _snapshot(self) -> ClusterSnapshot:
        self._require()
        assert self.snapshot is not None
        return self.snapshot

    def _info(self, outcome: RoundOutcome | None, parts: dict[str, float]) -> dict[str, Any]:
        sim = self._require()
        info: dict[str, Any] = {"time_s": sim.now, "finished": len(sim.finished_jobs())}
        if outcome is not None:
            info.update(
                normalized_goodput=outcome.normalized_goodput,
                ooms=outcome.ooms,
                nan_events=outcome.nan_events,
                restarts=outcome.restarts,
                energy_kwh=outcome.energy_kwh,
                idle_energy_kwh=outcome.idle_energy_kwh,
                busy_gpus=outcome.busy_gpus,
                reward_parts=parts,
            )
        return info
