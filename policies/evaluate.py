"""Run scheduling policies side by side on the same trace and seeds.

Each (policy, seed) pair replays the whole trace in a fresh ``ClusterEnv`` (the simulated
cluster the daemon runs, through the daemon's decision step) until every job has
finished (or ``max_steps`` rounds pass) and reports:

- ``avg_jct_s``, ``p99_jct_s``: job completion time, submission to finish (queueing in),
  over finished jobs;
- ``makespan_s``: first submission to last finish;
- ``goodput``: the cluster's normalized goodput averaged over the makespan: each job's
  goodput divided by its reference goodput (reference GPUs, data parallel, fp32), summed
  over running jobs;
- ``gpu_util``: allocated GPU-seconds over the cluster's GPU-seconds in the makespan;
- ``energy_kwh``: what the cluster drew over the episode (running jobs from the
  performance model's power, idle GPUs at their idle share, parked ones at none);
- ``idle_energy_kwh``: the part idle GPUs drew;
- ``n_jobs_done``; ``n_jobs_failed``: jobs whose config ran out of memory.

With ``tenants`` (their quotas enforced by the decision step, as in the daemon), each
run also reports ``tenants``: per tenant, its jobs, their average JCT, its share of the
cluster's GPU time against its quota's share, its quota attainment and its time waiting
for its quota (``autotune.envs.tenants``), measured round by round through
``run_episode``'s per-round hook.

Top-level figures are means over seeds; ``per_seed`` keeps each run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any, Protocol

import numpy as np

from autotune.core import NodeInfo, TenantSpec
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.simulator import Arrival, SimulatedCluster
from autotune.envs.tenants import TENANT_FIGURES, TenantMeter
from autotune.interfaces import ClusterSnapshot, Policy, PolicyChoice
from autotune.policies.baselines import make_policy
from autotune.rl.environment import EVALUATION, EnvConfig

__all__ = ["METRICS", "PlayedEnv", "RoundHook", "evaluate_policies", "run_episode"]

RoundHook = Callable[[ClusterSnapshot, SimulatedCluster], None]
"""Called after every round of an episode with the snapshot the round was decided on
and the simulated cluster that played it (e.g. ``autotune.envs.tenants.TenantMeter``)."""


class PlayedEnv(Protocol):
    """What an episode is played on: a ``ClusterEnv``, or a study's wrapper of one
    (``autotune.studies.pollux.env.PolluxCompatEnv``)."""

    @property
    def sim(self) -> SimulatedCluster | None: ...
    @property
    def snapshot(self) -> ClusterSnapshot | None: ...
    @property
    def round_s(self) -> float: ...

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]: ...

    def step_choices(
        self, choices: Mapping[str, PolicyChoice]
    ) -> tuple[Any, float, bool, bool, dict[str, Any]]: ...


METRICS = (
    "avg_jct_s",
    "p99_jct_s",
    "makespan_s",
    "goodput",
    "gpu_util",
    "energy_kwh",
    "idle_energy_kwh",
    "n_jobs_done",
    "n_jobs_failed",
    "restarts_per_job",
)


def run_episode(
    policy: Policy, env: PlayedEnv, seed: int, *, on_round: RoundHook | None = None
) -> dict[str, float]:
    """One replay of the env's trace under ``policy``; ``on_round`` sees every round."""
    env.reset(seed=seed)
    sim = env.sim
    assert sim is not None
    assert env.snapshot is not None
    interval = env.round_s
    goodput_s = busy_gpu_s = energy = idle = 0.0
    while True:
        decided_on = env.snapshot
        _, _, terminated, truncated, info = env.step_choices(policy.decide(decided_on).choices)
        if on_round is not None:
            on_round(decided_on, sim)
        goodput_s += info["normalized_goodput"] * interval
        busy_gpu_s += info["busy_gpus"] * interval
        energy += info["energy_kwh"]
        idle += info["idle_energy_kwh"]
        if terminated or truncated:
            break
    done = sim.finished_jobs()
    first = min((j.status.spec.submitted_at for j in sim.jobs.values()), default=0.0)
    last = max((j.status.finished_s or 0.0 for j in done), default=first)
    makespan = max(last - first, interval)
    jct = np.array([(j.status.finished_s or 0.0) - j.status.spec.submitted_at for j in done])
    return {
        "avg_jct_s": float(jct.mean()) if jct.size else math.nan,
        "p99_jct_s": float(np.percentile(jct, 99)) if jct.size else math.nan,
        "makespan_s": float(makespan),
        "goodput": goodput_s / makespan,
        "gpu_util": busy_gpu_s / (sim.total_gpus * makespan),
        "energy_kwh": energy,
        "idle_energy_kwh": idle,
        "n_jobs_done": float(len(done)),
        "n_jobs_failed": float(len(sim.failed_jobs())),
        # Reconfigurations of running jobs (each a restart), per job of the trace.
        "restarts_per_job": sum(j.restarts for j in sim.jobs.values()) / max(1, len(sim.jobs)),
    }


def evaluate_policies(
    *,
    nodes: Sequence[NodeInfo],
    jobs: Sequence[Arrival],
    policies: Sequence[str],
    seeds: int,
    config: EnvConfig = EVALUATION,
    world: Callable[[ClusterEnv], PlayedEnv] | None = None,
    progress: Callable[[str, int], None] | None = None,
    trace: dict[str, Any] | None = None,
    extra: Mapping[str, Callable[..., Policy]] | None = None,
    forecasts: Sequence[str] = ("lstm",),
    provisioning: Sequence[str] = (),
    tenants: Sequence[TenantSpec] = (),
    on_round: RoundHook | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The report of ``autotune eval``: every policy on the same jobs and seeds, each
    episode in a ``ClusterEnv`` of ``config`` with ``fields`` (any ``EnvConfig`` field)
    replaced; ``world`` wraps it into a study's world (then ``extra`` should make every
    policy: the baselines know the default world only). ``extra`` makes policies beyond
    the baselines (the learned ones), by name, from the environment and the seed; a
    factory taking a ``forecast`` keyword is given each of ``forecasts`` (what fills the
    learned policy's forecast features: ``autotune.policies.forecast.FORECASTS``).

    ``provisioning``: also run each policy with each provisioning mode
    (``autotune.provisioning.PROVISIONING``: ``none`` keeps every node on, ``buffer``
    provisions for persistence + buffer, ``forecast`` for the forecast of ``forecasts``);
    idle rounds are then played, so idle energy counts. Rows are named
    ``policy[ forecast=F][ provisioning=P]`` where there is more than one choice or
    provisioning is on.

    ``tenants``: the cluster's tenants (the jobs name theirs in ``JobSpec.tenant``), whose
    quotas the decision step enforces; each run then reports every tenant's figures
    (``autotune.envs.tenants.TenantMeter``) under ``tenants``, their means over seeds in
    the row. ``on_round`` sees every round of every episode (``run_episode``'s)."""
    from autotune.policies.forecast import demand_forecaster
    from autotune.provisioning import PROVISIONING, Provisioner

    bad = [p for p in provisioning if p not in PROVISIONING]
    if bad:
        raise ValueError(f"provisioning {bad}: one of {PROVISIONING}")
    config = replace(config, **fields)
    played = asdict(config)
    report: dict[str, Any] = {
        "trace": {
            **(trace or {}),
            "jobs": len(jobs),
            "gpus": sum(n.gpu_count for n in nodes),
            "nodes": len(nodes),
            "seeds": seeds,
            **{
                k: played[k]
                for k in (
                    "round_s",
                    "restart_s",
                    "start_s",
                    "noise",
                    "wake_s",
                    "mix_models",
                    "drawn_sensitivity",
                )
            },
            "forecasts": list(forecasts),
            "provisioning": list(provisioning),
            **({"tenants": {t.name: t.nominal_gpus for t in tenants}} if tenants else {}),
        },
        "policies": {},
    }
    modes: Sequence[str | None] = list(provisioning) or [None]
    for name in policies:
        learned = bool(extra and name in extra and _takes_forecast(extra[name]))
        for forecast in forecasts if learned or provisioning else forecasts[:1]:
            for mode in modes:
                if not learned and mode != "forecast" and forecast != forecasts[0]:
                    continue  # the forecast changes nothing here: one row is enough
                row = name
                if len(forecasts) > 1:
                    row += f" forecast={forecast}"
                if mode is not None:
                    row += f" provisioning={mode}"
                per_seed: list[dict[str, Any]] = []
                for seed in range(seeds):
                    provisioner = None
                    if mode is not None:
                        kind = {"none": None, "buffer": "persistence", "forecast": forecast}[mode]
                        provisioner = Provisioner(demand_forecaster(kind) if kind else None)
                    cluster = ClusterEnv(
                        config, nodes=nodes, jobs=jobs, provisioner=provisioner, tenants=tenants
                    )
                    env: PlayedEnv = cluster if world is None else world(cluster)
                    policy = None
                    if extra and name in extra:
                        factory = extra[name]
                        policy = (
                            factory(env, seed, forecast=forecast) if learned else factory(env, seed)
                        )
                    policy = policy or make_policy(name, cluster, seed)
                    meter = TenantMeter(tenants) if tenants else None
                    hooks = [h for h in (meter.observe if meter else None, on_round) if h]
                    run: dict[str, Any] = dict(
                        run_episode(policy, env, seed, on_round=_each(hooks) if hooks else None)
                    )
                    if meter is not None:
                        assert env.sim is not None
                        run["tenants"] = meter.figures(
                            [j.status for j in env.sim.jobs.values()],
                            total_gpus=env.sim.total_gpus,
                            makespan_s=run["makespan_s"],
                        )
                    per_seed.append(run)
                    if progress:
                        progress(row, seed)
                summary: dict[str, Any] = {
                    key: float(np.mean([run[key] for run in per_seed])) for key in METRICS
                }
                summary["policy"] = name
                summary["forecast"] = forecast
                summary["provisioning"] = mode
                if tenants:
                    summary["tenants"] = _mean_tenants([run["tenants"] for run in per_seed])
                summary["per_seed"] = per_seed
                report["policies"][row] = summary
    return report


def _each(hooks: Sequence[RoundHook]) -> RoundHook:
    def hook(snapshot: ClusterSnapshot, sim: SimulatedCluster) -> None:
        for each in hooks:
            each(snapshot, sim)

    return hook


def _takes_forecast(factory: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "forecast" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _mean_tenants(runs: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Each tenant's figures averaged over runs (a tenant absent from a run is left out of
    that run's share of the mean)."""
    names = list(dict.fromkeys(name for run in runs for name in run))
    return {
        name: {
            key: float(np.mean([run[name][key] for run in runs if name in run]))
            for key in TENANT_FIGURES
        }
        for name in names
    }
