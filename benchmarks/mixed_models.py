"""One data-parallel job across GPU models (``mix_models``), against one model per job:
average JCT, GPU utilisation and goodput on heterogeneous clusters, each played with
and without mixing on the same jobs and seeds, through the daemon's decision step.

    python bench/mixed_models.py [--seeds 3] [--window 60] [--policies rules,ppo] [--out F]

Shapes: the 8xH100 + 4xV100-32GB cluster (one node of each: NVLink inside the H100
node), a lab of 2x8 H100 beside 4x8 V100-16GB, and the daemon's default cluster
(2x8 A100, 8 V100-32GB, 2x4 T4). Jobs: the built-in stream sized for each cluster
(``autotune.envs.workloads.scaled_stream``: ``window`` jobs per 32 GPUs, load 1, seeded).
Besides the figures of ``autotune eval``, each run counts ``mixed_gpu_share``: the share
of busy GPU-rounds held by jobs placed across models; and per job and seed, its JCT with
mixing minus without, with the mean's 95% interval (``paired_jct_diff_s``). Prints a
table and one JSON object (``--out`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.benchmarks.unseen_clusters import _lab
from autotune.catalog.devices import node_info
from autotune.cli.policy import learned_policies
from autotune.core import NodeInfo
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import default_nodes
from autotune.envs.simulator import SimulatedCluster
from autotune.envs.workloads import scaled_stream
from autotune.interfaces import ClusterSnapshot
from autotune.perf.model import shape_of
from autotune.policies.baselines import make_policy
from autotune.policies.evaluate import run_episode
from autotune.rl.environment import EVALUATION
from autotune.stats import mean_t_interval

SEED: Final = 31_337
"""Seeds the job streams (one per shape)."""

FIGURES: Final = ("avg_jct_s", "gpu_util", "goodput", "n_jobs_done")


def _seeds_cluster() -> list[NodeInfo]:
    """8 H100 in one node beside 4 V100-32GB in another."""
    return [
        node_info("h100-0", gpu_model="H100", gpu_count=8, cpu_milli=96_000, memory_mib=1 << 20),
        node_info("v100-0", gpu_model="V100M32", gpu_count=4, cpu_milli=48_000, memory_mib=1 << 18),
    ]


SHAPES: Final[dict[str, Callable[[], list[NodeInfo]]]] = {
    "8xH100+4xV100-32GB": _seeds_cluster,
    "lab-16xH100+32xV100-16GB": _lab,
    "default-16xA100+8xV100+8xT4": default_nodes,
}


class MixedMeter:
    """Busy GPU-rounds, and those of jobs running across GPU models."""

    def __init__(self) -> None:
        self.busy = 0
        self.mixed = 0

    def __call__(self, snapshot: ClusterSnapshot, sim: SimulatedCluster) -> None:
        nodes = {n.node_id: n for n in sim.nodes}
        for job in sim.observe().jobs:
            if job.state != "running" or job.placement is None:
                continue
            gpus = job.placement.world_size
            self.busy += gpus
            if shape_of(job.placement, nodes).mixed:
                self.mixed += gpus


def play(
    nodes: list[NodeInfo], jobs: list[Any], policy: str, seed: int, *, mix: bool, extra: Any
) -> tuple[dict[str, float], dict[str, float]]:
    """One episode's figures, and each finished job's JCT (s) by id."""
    env = ClusterEnv(EVALUATION, nodes=nodes, jobs=jobs, slots=32, mix_models=mix)
    chosen = (
        extra[policy](env, seed, forecast="lstm")
        if policy in extra
        else make_policy(policy, env, seed)
    )
    meter = MixedMeter()
    run = run_episode(chosen, env, seed, on_round=meter)
    run["mixed_gpu_share"] = meter.mixed / max(1, meter.busy)
    assert env.sim is not None
    jct = {
        j.status.spec.job_id: (j.status.finished_s or 0.0) - j.status.spec.submitted_at
        for j in env.sim.finished_jobs()
    }
    return run, jct


def run(
    *,
    seeds: int,
    window: int,
    policies: list[str],
    only: list[str] | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    extra = (
        learned_policies(["ppo"], checkpoint=None, slots=32, round_s=300.0, budget_s=0)
        if "ppo" in policies
        else {}
    )
    report: dict[str, Any] = {"seeds": seeds, "window": window, "shapes": {}}
    for k, (name, build) in enumerate(SHAPES.items()):
        if only and name not in only:
            continue
        nodes = build()
        gpus = sum(n.gpu_count for n in nodes)
        models = Counter[str]()
        for node in nodes:
            models[node.gpu_model] += node.gpu_count
        jobs = scaled_stream(np.random.default_rng([SEED, k]), gpus, window=window)
        began = time.perf_counter()
        entry: dict[str, Any] = {"gpus": gpus, "models": dict(models), "jobs": len(jobs)}
        for policy in policies:
            rows: dict[str, Any] = {}
            jcts: dict[bool, list[dict[str, float]]] = {}
            for mix in (False, True):
                played = [
                    play(nodes, jobs, policy, seed, mix=mix, extra=extra) for seed in range(seeds)
                ]
                runs = [run for run, _ in played]
                jcts[mix] = [jct for _, jct in played]
                rows["mixed" if mix else "one_model"] = {
                    f: float(np.mean([r[f] for r in runs])) for f in (*FIGURES, "mixed_gpu_share")
                } | {"per_seed_jct_s": [r["avg_jct_s"] for r in runs]}
            rows["jct_mixed_vs_one_model"] = (
                rows["mixed"]["avg_jct_s"] / rows["one_model"]["avg_jct_s"]
            )
            # Per job and seed, the JCT with mixing minus without (jobs that finished in
            # both), its mean and 95% interval.
            paired = [
                with_mix[job] - without[job]
                for without, with_mix in zip(jcts[False], jcts[True], strict=True)
                for job in without.keys() & with_mix.keys()
            ]
            rows["paired_jct_diff_s"] = mean_t_interval(paired) | {"pairs": len(paired)}
            entry[policy] = rows
            print(
                f"{name} {policy}: JCT mixed/one-model {rows['jct_mixed_vs_one_model']:.3f}, "
                f"mixed GPU share {rows['mixed']['mixed_gpu_share']:.3f}",
                file=sys.stderr,
                flush=True,
            )
        entry["wall_s"] = round(time.perf_counter() - began, 1)
        report["shapes"][name] = entry
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report) + "\n")
    return report


def _interval(found: dict[str, Any]) -> str:
    if found["mean"] is None:
        return "-"
    if found["low"] is None:
        return f"{found['mean']:,.0f}"
    return f"{found['mean']:,.0f} [{found['low']:,.0f}, {found['high']:,.0f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--window", type=int, default=60, help="jobs per 32 GPUs")
    parser.add_argument("--policies", default="rules,ppo", help="comma-separated")
    parser.add_argument("--only", default=None, help="comma-separated shape names")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    report = run(
        seeds=args.seeds,
        window=args.window,
        policies=[p.strip() for p in args.policies.split(",") if p.strip()],
        only=args.only.split(",") if args.only else None,
        out=args.out,
    )
    print(
        "| cluster | policy | JCT one model (s) | JCT mixed (s) | mixed/one | util one "
        "| util mixed | mixed GPU share | paired JCT diff (s), 95% |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, e in report["shapes"].items():
        for policy in args.policies.split(","):
            if policy not in e:
                continue
            one, mixed = e[policy]["one_model"], e[policy]["mixed"]
            print(
                f"| {name} | {policy} | {one['avg_jct_s']:,.0f} | {mixed['avg_jct_s']:,.0f} "
                f"| {e[policy]['jct_mixed_vs_one_model']:.3f} | {one['gpu_util']:.3f} "
                f"| {mixed['gpu_util']:.3f} | {mixed['mixed_gpu_share']:.3f} "
                f"| {_interval(e[policy]['paired_jct_diff_s'])} |"
            )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
