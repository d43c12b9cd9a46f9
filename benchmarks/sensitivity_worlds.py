"""What jobs' drawn compression sensitivities change for each policy: the daemon's built-in
job stream played on a cluster, every job at the catalog's price of compression, then
each at a sensitivity drawn from the spread measured over real tasks
(``autotune.perf.sensitivity``, ``EnvConfig.drawn_sensitivity``) while the policies still
price compression by the catalog.

    python bench/sensitivity_worlds.py [--cluster-file bench/clusters/default-10gbe.json]
        [--policies rules,oracle,ppo] [--checkpoint DIR] [--seeds 2] [--jobs 60]

Per policy and world: goodput, average JCT, and the share of the jobs' GPU time spent
under each kind of compression (from the decided configurations, round by round). The
oracle reads the simulator, so it knows each job's draw; the others do not. One JSON
object on stdout and in ``bench/out/sensitivity_worlds.json``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from autotune.benchmarks import OUT, publish
from autotune.catalog.clusters import load_cluster
from autotune.cli.policy import learned_policies
from autotune.envs.presets import default_nodes
from autotune.envs.workloads import job_stream
from autotune.policies.evaluate import evaluate_policies
from autotune.rl.environment import EVALUATION


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cluster-file", type=Path, help="default: the daemon's cluster")
    parser.add_argument("--policies", default="rules,oracle,ppo")
    parser.add_argument(
        "--checkpoint", type=Path, help="the learned policy ppo plays (default: the shipped)"
    )
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=60, help="jobs of the stream (30 at start)")
    parser.add_argument("--stream-seed", type=int, default=123)
    parser.add_argument("--out", type=Path, default=OUT / "sensitivity_worlds.json")
    args = parser.parse_args(argv)
    nodes = load_cluster(args.cluster_file).nodes if args.cluster_file else tuple(default_nodes())
    jobs = list(
        job_stream(
            np.random.default_rng(args.stream_seed),
            mean_interarrival_s=300.0,
            initial_jobs=args.jobs // 2,
            max_jobs=args.jobs,
        )
    )
    policies = args.policies.split(",")
    extra = learned_policies(
        policies,
        checkpoint=args.checkpoint,
        slots=EVALUATION.slots,
        round_s=EVALUATION.round_s,
        budget_s=0,
    )
    worlds: dict[str, Any] = {}
    for drawn in (False, True):
        world = {}
        for name in policies:
            gpu_rounds: dict[str, float] = defaultdict(float)

            def count(snapshot: Any, sim: Any, into: dict[str, float] = gpu_rounds) -> None:
                # GPU-rounds of the running jobs as the round left them, by compression.
                for job in sim.jobs.values():
                    config = job.status.config
                    if job.status.state == "running" and config is not None:
                        into[config.compression.kind] += config.world_size

            report = evaluate_policies(
                nodes=nodes,
                jobs=jobs,
                policies=[name],
                seeds=args.seeds,
                extra=extra,
                drawn_sensitivity=drawn,
                on_round=count,
            )
            row = report["policies"][name]
            total = sum(gpu_rounds.values()) or 1.0
            world[name] = {
                "goodput": row["goodput"],
                "avg_jct_s": row["avg_jct_s"],
                "n_jobs_done": row["n_jobs_done"],
                "gpu_time_share": {k: round(v / total, 4) for k, v in sorted(gpu_rounds.items())},
            }
            print(json.dumps({"drawn": drawn, "policy": name, **world[name]}), flush=True)
        worlds["drawn" if drawn else "catalog"] = world
    publish(
        "sensitivity_worlds",
        args.out,
        {
            "cluster": str(args.cluster_file or "default"),
            "checkpoint": str(args.checkpoint or "shipped"),
            "jobs": len(jobs),
            "stream_seed": args.stream_seed,
            "seeds": args.seeds,
            "worlds": worlds,
        },
    )
    return 0
