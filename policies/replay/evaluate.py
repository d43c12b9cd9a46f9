"""``autotune replay evaluate``: candidate policies against the logging policy, two ways.

1. **Counterfactual simulation.** A workload (the export's logged jobs, or a Pollux
   workload slice) is played in the simulated cluster under each policy, with the same
   seeds, served exactly as the daemon serves it (``LearnedPolicy``; ``epsilon`` 0:
   deterministic). Reported per policy: average JCT, goodput, energy, each a mean over
   seeds with a 95% t-interval; and per candidate the paired difference from the baseline
   (the first policy, the logging one) per seed.
2. **Off-policy estimates** on the logged rows (``autotune.policies.replay.ope``): the expected
   reward of one job's decision under each candidate acting epsilon-greedily with the
   logged epsilon, against the logged behaviour, by self-normalised importance sampling
   and doubly robust estimation, with 95% bootstrap intervals resampled by episode, the
   effective sample size and the share of clipped weights.

The verdict for each candidate: promote only if the lower 95% bound of (candidate -
logging) is above 0 under both off-policy estimates and in the counterfactual
simulation (its goodput gain, or its average JCT cut: a workload whose jobs never queue
has the same goodput under every policy), and the effective sample size is at least 10%
of the rows; otherwise it names every test that failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.core import DEFAULT_ROUND_S, NodeInfo
from autotune.envs.simulator import Arrival
from autotune.errors import InputError
from autotune.stats import mean_t_interval

__all__ = ["PolicySpec", "counterfactual", "evaluate_replay", "parse_policy"]

CF_METRICS = ("avg_jct_s", "p99_jct_s", "goodput", "energy_kwh", "n_jobs_done")
"""Counterfactual figures reported per policy."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy to evaluate: ``rules``, or a checkpoint (``NAME=PATH`` or ``PATH``)."""

    name: str
    checkpoint: Path | None = None

    @property
    def is_rules(self) -> bool:
        return self.checkpoint is None


def parse_policy(text: str) -> PolicySpec:
    """``rules``, ``shipped`` (the policy in the package), ``NAME=PATH`` or ``PATH``."""
    from autotune.policies.serving import default_policy_checkpoint

    text = text.strip()
    if text == "rules":
        return PolicySpec("rules")
    if text == "shipped":
        return PolicySpec("shipped", default_policy_checkpoint())
    name, sep, path = text.partition("=")
    if not sep:
        name, path = Path(text).name or text, text
    checkpoint = Path(path).expanduser()
    if not checkpoint.exists():
        raise InputError("no policy checkpoint here", path=str(checkpoint))
    return PolicySpec(name, checkpoint)


def counterfactual(
    *,
    nodes: Sequence[NodeInfo],
    arrivals: Sequence[Arrival],
    policies: Sequence[PolicySpec],
    seeds: int = 3,
    round_s: float = DEFAULT_ROUND_S,
    slots: int = 32,
    epsilon: float = 0.0,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Every policy on the same workload and seeds (see the module docstring)."""
    from autotune.envs.cluster_env import ClusterEnv
    from autotune.policies.evaluate import METRICS, evaluate_policies
    from autotune.policies.serving import LearnedPolicy, PolicyServer

    if not arrivals:
        raise InputError("the workload has no jobs")
    servers = {
        spec.name: PolicyServer(spec.checkpoint, slots=slots)
        for spec in policies
        if spec.checkpoint is not None
    }

    def factory(spec: PolicySpec) -> Callable[[ClusterEnv, int], Any]:
        def make(env: ClusterEnv, seed: int) -> Any:
            return LearnedPolicy(
                server=servers[spec.name],
                slots=slots,
                round_s=env.round_s,
                epsilon=epsilon,
                seed=seed,
            )

        return make

    report = evaluate_policies(
        nodes=nodes,
        jobs=arrivals,
        policies=[spec.name for spec in policies],
        seeds=seeds,
        slots=slots,
        round_s=round_s,
        progress=progress,
        extra={spec.name: factory(spec) for spec in policies if not spec.is_rules},
    )
    baseline = policies[0].name
    out: dict[str, Any] = {"trace": report["trace"], "baseline": baseline, "policies": {}}
    base_runs = report["policies"][baseline]["per_seed"]
    for spec in policies:
        runs = report["policies"][spec.name]["per_seed"]
        entry: dict[str, Any] = {
            key: mean_t_interval([run[key] for run in runs]) for key in CF_METRICS
        }
        entry["per_seed"] = [{k: run[k] for k in METRICS} for run in runs]
        if spec.name != baseline:
            entry["vs_baseline"] = {
                key: mean_t_interval(
                    [a[key] - b[key] for a, b in zip(runs, base_runs, strict=True)]
                )
                for key in ("avg_jct_s", "goodput", "energy_kwh")
            }
            base_jct = np.mean([b["avg_jct_s"] for b in base_runs])
            base_goodput = np.mean([b["goodput"] for b in base_runs])
            entry["relative"] = {
                "avg_jct": float(np.mean([a["avg_jct_s"] for a in runs]) / base_jct - 1),
                "goodput": float(np.mean([a["goodput"] for a in runs]) / base_goodput - 1),
            }
        out["policies"][spec.name] = entry
    return out


def off_policy(
    data_dir: Path,
    policies: Sequence[PolicySpec],
    *,
    resamples: int = 1000,
    seed: int = 0,
    max_weight: float = 50.0,
) -> dict[str, Any]:
    """Each candidate's off-policy estimates against the logging policy (the first of
    ``policies``, a checkpoint: its epsilon-greedy probabilities must reproduce the logged
    ones, ``logging_mismatch_share`` says how far they do)."""
    from autotune.policies.replay.logged import LoggedDecisions
    from autotune.policies.replay.ope import compare
    from autotune.policies.serving import PolicyServer
    from autotune.rl.acting import entry_probabilities

    if policies[0].checkpoint is None:
        raise InputError(
            "the first policy is the logging policy and must be a checkpoint (the one the "
            "daemon logged with): rules acts deterministically"
        )
    data = LoggedDecisions.from_export(data_dir)
    eps = _epsilons(data_dir)

    def probabilities(spec: PolicySpec) -> list[np.ndarray]:
        server = PolicyServer(spec.checkpoint, slots=1)
        return entry_probabilities(server.logits(data.obs), eps)

    logging_probs = probabilities(policies[0])
    out: dict[str, Any] = {
        "logging": policies[0].name,
        "rows": data.rows,
        "episodes": data.episodes,
        "logged_mean_reward": data.mean_reward,
        "policies": {},
    }
    for spec in policies[1:]:
        if spec.checkpoint is None:
            out["policies"][spec.name] = {
                "skipped": "rules acts deterministically: no probabilities to weigh by"
            }
            continue
        result = compare(
            data,
            probabilities(spec),
            logging_probs,
            resamples=resamples,
            seed=seed,
            max_weight=max_weight,
        )
        out["policies"][spec.name] = result.to_json()
    return out


def _epsilons(data_dir: Path) -> np.ndarray:
    """The logged exploration floor of every row, in the order ``from_export`` reads."""
    import pyarrow.parquet as pq

    files = sorted(data_dir.glob("transitions-*.parquet"))
    return np.concatenate(
        [pq.read_table(f, columns=["epsilon"]).column("epsilon").to_numpy() for f in files]
    )


def verdicts(cf: dict[str, Any] | None, ope: dict[str, Any] | None) -> dict[str, Any]:
    """Per candidate: promote only if every estimate's lower 95% bound of (candidate -
    logging) is above 0 (the counterfactual goodput gain or average JCT cut, SNIS, DR)
    and the effective sample size is at least 10% of the rows; otherwise the tests that
    failed."""
    out: dict[str, Any] = {}
    names: list[str] = []
    for source in (cf, ope):
        for name in (source or {}).get("policies", {}):
            if name not in names:
                names.append(name)
    baseline = (cf or {}).get("baseline") or (ope or {}).get("logging")
    for name in names:
        if name == baseline:
            continue
        failed: list[str] = []
        cf_entry = (cf or {}).get("policies", {}).get(name)
        if cf_entry is not None:
            goodput = cf_entry["vs_baseline"]["goodput"]
            jct = cf_entry["vs_baseline"]["avg_jct_s"]
            if goodput["low"] is None or jct["high"] is None:
                failed.append("counterfactual: one seed gives no interval (use --seeds 2 or more)")
            elif goodput["low"] <= 0 and jct["high"] >= 0:
                # Better in either: more goodput, or a shorter average JCT.
                failed.append(
                    "counterfactual: neither the goodput gain's lower 95% bound "
                    f"({goodput['low']:+.3f}) nor the average JCT cut's "
                    f"({-jct['high']:+.1f} s) is above 0"
                )
        ope_entry = (ope or {}).get("policies", {}).get(name)
        if ope is None:
            failed.append("off-policy: not estimated (no logged rows: give --data)")
        elif ope_entry is not None and "verdict" in ope_entry:
            failed.extend(f"off-policy: {why}" for why in ope_entry["verdict"]["failed"])
        elif ope_entry is not None:
            failed.append(f"off-policy: {ope_entry.get('skipped', 'not estimated')}")
        out[name] = {"promote": not failed, "failed": failed}
    return out


def evaluate_replay(
    data_dir: Path | None,
    policies: Sequence[PolicySpec],
    *,
    workload: tuple[list[NodeInfo], list[Arrival], float] | None = None,
    seeds: int = 3,
    resamples: int = 1000,
    seed: int = 0,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Both estimates and the verdicts. ``workload`` (nodes, arrivals, round period):
    what the counterfactual simulation plays (default: the export's ``workload.json``);
    ``data_dir`` ``None``: the counterfactual simulation alone."""
    from autotune.envs.workloads import load_workload

    if len(policies) < 2:
        raise InputError("give the logging policy and at least one candidate (--policy twice)")
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"two policies named {', '.join(twice)}: name them (NAME=CHECKPOINT)")
    if data_dir is not None and policies[0].checkpoint is None:
        raise InputError(
            "the first policy is the logging policy and must be a checkpoint (the one the "
            "daemon logged with): rules acts deterministically"
        )
    if workload is None:
        if data_dir is None:
            raise InputError("nothing to evaluate on: give --data or a workload")
        workload = load_workload(data_dir)
    nodes, arrivals, round_s = workload
    cf = counterfactual(
        nodes=nodes,
        arrivals=arrivals,
        policies=policies,
        seeds=seeds,
        round_s=round_s,
        progress=progress,
    )
    ope = None
    if data_dir is not None:
        ope = off_policy(data_dir, policies, resamples=resamples, seed=seed)
    return {
        "policies": [
            {"name": p.name, "checkpoint": str(p.checkpoint) if p.checkpoint else None}
            for p in policies
        ],
        "counterfactual": cf,
        "off_policy": ope,
        "verdicts": verdicts(cf, ope),
    }
