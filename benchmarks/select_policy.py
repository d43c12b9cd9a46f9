"""Pick the checkpoint to ship from a training run, on training-distribution episodes only
(`python bench/select_policy.py RUN_DIR`).

Each checkpoint (``warm_start`` and every ``iter_NNNN``/``final`` of the run) and the
``rules`` and ``oracle`` baselines replay Pollux workloads 1 and 8 (64 T4 GPUs),
Alibaba v2023 pods 2000-2099 (the pods the training windows are drawn from) and 60 jobs
of the daemon's built-in stream on its default cluster (stream seed 123), one seed,
through ``autotune.policies.evaluate``. Prints one JSON object: per checkpoint and case
the goodput and average JCT relative to ``rules``, their geometric means over the cases,
and the pick (highest mean goodput ratio; ties to the lower JCT ratio). Never reads
Pollux workload 6 or Alibaba pods before 1000, which are the test traces.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from autotune.envs import traces
from autotune.envs.presets import default_nodes, pollux_nodes
from autotune.envs.workloads import job_stream, jobs_from_trace
from autotune.policies.evaluate import evaluate_policies
from autotune.policies.ppo import module_dir
from autotune.policies.serving import LearnedPolicy, PolicyServer


def _cases(data: Path) -> list[tuple[str, Any, Any]]:
    pollux = data / "pollux" / "workloads"
    alibaba = data / "alibaba-v2023"
    cases = [
        (
            f"pollux-{w}",
            pollux_nodes(64),
            jobs_from_trace(traces.pollux_workload(pollux / f"workload-{w}.csv")),
        )
        for w in (1, 8)
    ]
    pods = traces.alibaba_jobs(alibaba / "openb_pod_list_default.csv.gz", seed=0, limit=2100)[2000:]
    origin = pods[0].submit_s
    from dataclasses import replace

    pods = [replace(p, submit_s=p.submit_s - origin) for p in pods]
    nodes = traces.load_nodes(alibaba / "openb_node_list_gpu_node.csv.gz")
    cases.append(("alibaba-2000", nodes, jobs_from_trace(pods)))
    # The daemon's default world, with a stream seed the daemon benchmark does not use.
    stream = list(
        job_stream(
            np.random.default_rng(123), mean_interarrival_s=300.0, initial_jobs=30, max_jobs=60
        )
    )
    cases.append(("stream-123", default_nodes(), stream))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=Path)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--slots", type=int, default=32)
    args = parser.parse_args()
    checkpoints = sorted(
        p
        for p in args.run.iterdir()
        if p.is_dir() and (p.name.startswith(("iter_", "final", "warm")))
    )
    cases = _cases(args.data)
    baseline: dict[str, dict[str, Any]] = {}
    for name, nodes, jobs in cases:
        report = evaluate_policies(
            nodes=nodes, jobs=jobs, policies=["rules", "oracle"], seeds=1, slots=args.slots
        )
        baseline[name] = report["policies"]
    rows: dict[str, dict[str, Any]] = {}
    for checkpoint in checkpoints:
        server = PolicyServer(module_dir(checkpoint), slots=args.slots)
        goodput, jct = [], []
        for name, nodes, jobs in cases:
            report = evaluate_policies(
                nodes=nodes,
                jobs=jobs,
                policies=["ppo"],
                seeds=1,
                slots=args.slots,
                extra={
                    "ppo": lambda env, seed, server=server: LearnedPolicy(
                        slots=args.slots, server=server
                    )
                },
            )
            row = report["policies"]["ppo"]
            goodput.append(row["goodput"] / baseline[name]["rules"]["goodput"])
            jct.append(row["avg_jct_s"] / baseline[name]["rules"]["avg_jct_s"])
        rows[checkpoint.name] = {
            # Geometric means: a case where rules collapses (one stuck job stretches its
            # makespan) must not outweigh the others.
            "goodput_vs_rules": float(np.exp(np.mean(np.log(goodput)))),
            "jct_vs_rules": float(np.exp(np.mean(np.log(jct)))),
            "per_case": {
                name: {"goodput_vs_rules": g, "jct_vs_rules": j}
                for (name, _, _), g, j in zip(cases, goodput, jct, strict=True)
            },
        }
    pick = max(rows, key=lambda k: (rows[k]["goodput_vs_rules"], -rows[k]["jct_vs_rules"]))
    oracle = {
        name: {
            "goodput_vs_rules": b["oracle"]["goodput"] / b["rules"]["goodput"],
            "jct_vs_rules": b["oracle"]["avg_jct_s"] / b["rules"]["avg_jct_s"],
        }
        for name, b in baseline.items()
    }
    print(json.dumps({"checkpoints": rows, "oracle": oracle, "pick": pick}))


if __name__ == "__main__":
    main()
