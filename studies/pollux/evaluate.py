"""Policies played in the Pollux-compatible world, side by side (``autotune pollux eval``).

Every policy here is a daemon ``Policy`` whose choices the world keeps to Pollux's knobs
(``autotune.studies.pollux.env``): the default world's ``static``, ``rules``, ``random``
and ``tiresias``, and this world's own, which read the measured physics the jobs run on
(``optimus``, ``oracle``, ``goodput``, ``goodput-size``), and the learned policy trained
here (``ppo``). ``tune`` is not run: its trials judge configurations by the performance
model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from autotune.envs.presets import pollux_nodes
from autotune.envs.tenants import draw_tenants, quota_tenants
from autotune.interfaces import Policy
from autotune.policies.baselines import RandomPolicy, StaticPolicy
from autotune.policies.evaluate import evaluate_policies
from autotune.policies.rules import RulesPolicy
from autotune.policies.tiresias import TiresiasPolicy
from autotune.studies.pollux.env import (
    RESTART_S,
    ROUND_S,
    PolluxCompatEnv,
    compat_arrivals,
)
from autotune.studies.pollux.goodput import GoodputPolicy, SizedGoodputPolicy
from autotune.studies.pollux.optimus import OptimusPolicy
from autotune.studies.pollux.oracle import MeasuredOraclePolicy

__all__ = ["POLICIES", "evaluate_compat", "policy_factories"]

POLICIES: Final[dict[str, Callable[[PolluxCompatEnv, int], Policy]]] = {
    "static": lambda env, seed: StaticPolicy(),
    "rules": lambda env, seed: RulesPolicy(),
    "random": lambda env, seed: RandomPolicy(seed, slots=env.slots),
    "tiresias": lambda env, seed: TiresiasPolicy(),
    "optimus": lambda env, seed: OptimusPolicy(env.cluster),
    "oracle": lambda env, seed: MeasuredOraclePolicy(env.cluster, slots=env.slots),
    "goodput": lambda env, seed: GoodputPolicy(env.cluster),
    "goodput-size": lambda env, seed: SizedGoodputPolicy(env.cluster),
}
"""The policies of this world but the learned one, by name: ``(env, seed) -> Policy``."""


def policy_factories(
    names: Sequence[str], *, checkpoint: Path | None, slots: int
) -> dict[str, Callable[..., Policy]]:
    """Factories of ``names`` for ``evaluate_policies``; ``ppo`` serves ``checkpoint`` (a
    module trained in this world: ``InputError`` now if it does not load or fit)."""
    factories: dict[str, Callable[..., Policy]] = {
        name: POLICIES[name] for name in names if name in POLICIES
    }
    if "ppo" in names:
        import torch

        from autotune.policies.serving import PolicyServer
        from autotune.studies.pollux.learned import PolluxLearnedPolicy

        torch.set_num_threads(1)
        server = PolicyServer(checkpoint, slots=slots, continuous=True)

        def ppo(env: PolluxCompatEnv, seed: int, forecast: str = "lstm") -> Policy:
            return PolluxLearnedPolicy(env.cluster, server, forecast=forecast)

        factories["ppo"] = ppo
    return factories


def evaluate_compat(
    workload: str | Path,
    traces: str | Path,
    policies: Sequence[str],
    *,
    checkpoint: Path | None = None,
    gpus: int = 64,
    seeds: int = 1,
    slots: int = 32,
    skip_jobs: int = 0,
    limit_jobs: int | None = None,
    forecast: str = "lstm",
    tenants: Mapping[str, float] | None = None,
    tenant_seed: int = 0,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Every policy of ``policies`` on the workload's jobs (``skip_jobs``, then
    ``limit_jobs`` of them) in the Pollux-compatible world; the report of
    ``autotune.policies.evaluate.evaluate_policies``. ``tenants``: shares of the cluster
    in percent by tenant (``autotune.envs.tenants``): the jobs drawn to them with
    ``tenant_seed``, their quotas enforced, each tenant's figures reported."""
    stop = None if limit_jobs is None else skip_jobs + limit_jobs
    jobs = compat_arrivals(workload, traces, f"{skip_jobs}:{stop or ''}")
    nodes = pollux_nodes(gpus)
    specs = quota_tenants(tenants, sum(n.gpu_count for n in nodes)) if tenants else ()
    if tenants:
        jobs = draw_tenants(jobs, tenants, seed=tenant_seed)
    return evaluate_policies(
        nodes=nodes,
        jobs=jobs,
        policies=list(policies),
        seeds=seeds,
        slots=slots,
        round_s=ROUND_S,
        restart_s=RESTART_S,
        start_s=RESTART_S,
        noise=False,
        world=PolluxCompatEnv,
        progress=progress,
        trace={
            "kind": "pollux-compat",
            "path": str(workload),
            "pollux_traces": str(traces),
            **({"policy_checkpoint": str(checkpoint)} if "ppo" in policies else {}),
            **({"tenant_seed": tenant_seed} if tenants else {}),
        },
        extra=policy_factories(policies, checkpoint=checkpoint, slots=slots),
        forecasts=[forecast],
        tenants=specs,
    )
