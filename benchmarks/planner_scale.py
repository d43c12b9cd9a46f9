"""Planner decision-round time by cluster size (`python bench/planner_scale.py`).

Clusters of 8-GPU A100 nodes at 64, 256, 1,024 and 4,096 GPUs; a queue of 1-8 GPU jobs
(seeded) asking for 1.2x the cluster; one ``plan()`` call each, timed, median of
``--repeat``. Then the steady state an environment meets on most steps: 32 GPUs, 16
running jobs on 30 of them kept where they are, 5 pending 4-GPU jobs that cannot fit;
the median of ``--steady-calls`` calls. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from autotune.catalog.devices import node_info
from autotune.core import JobSpec, NodeInfo
from autotune.planner import plan


def a100_nodes(gpus: int) -> list[NodeInfo]:
    return [
        node_info(f"n{i}", gpu_model="A100", gpu_count=8, cpu_milli=128_000, memory_mib=1 << 20)
        for i in range(gpus // 8)
    ]


def one(gpus: int, seed: int) -> tuple[float, int, int]:
    rng = np.random.default_rng(seed)
    nodes = a100_nodes(gpus)
    jobs: list[JobSpec] = []
    asked = 0
    while asked < 1.2 * gpus:
        size = int(rng.choice([1, 2, 4, 8], p=[0.4, 0.3, 0.2, 0.1]))
        jobs.append(
            JobSpec(
                job_id=f"j{len(jobs)}",
                min_gpus=size,
                max_gpus=size,
                cpu_milli=4_000,
                memory_mib=16_384,
            )
        )
        asked += size
    start = time.perf_counter()
    result = plan(jobs, nodes, {}, {})
    return time.perf_counter() - start, len(jobs), len(result.placements)


def steady(calls: int) -> dict[str, float | int]:
    """16 running jobs (14 of 2 GPUs, 2 of 1) kept on 32 GPUs, 5 pending 4-GPU jobs."""
    nodes = a100_nodes(32)
    running = [
        JobSpec(
            job_id=f"r{i}",
            min_gpus=2 if i < 14 else 1,
            max_gpus=2 if i < 14 else 1,
            cpu_milli=4_000,
            memory_mib=16_384,
            submitted_at=float(i),
        )
        for i in range(16)
    ]
    current = plan(running, nodes, {}).placements
    if len(current) != len(running):
        raise RuntimeError("steady state: the running jobs do not fit")
    pending = [
        JobSpec(
            job_id=f"p{i}",
            min_gpus=4,
            max_gpus=4,
            cpu_milli=4_000,
            memory_mib=16_384,
            submitted_at=100.0 + i,
        )
        for i in range(5)
    ]
    jobs = running + pending
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        result = plan(jobs, nodes, {}, current)
        times.append(time.perf_counter() - start)
    return {
        "median_s": round(statistics.median(times), 6),
        "jobs": len(jobs),
        "placed": len(result.placements),
        "kept": len(result.kept),
        "rounds": result.rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steady-calls", type=int, default=200)
    args = parser.parse_args()
    out: dict[str, object] = {}
    for gpus in (64, 256, 1024, 4096):
        runs = [one(gpus, args.seed + r) for r in range(args.repeat)]
        out[str(gpus)] = {
            "median_s": round(statistics.median(r[0] for r in runs), 4),
            "jobs": runs[0][1],
            "placed": runs[0][2],
        }
    out["steady state"] = steady(args.steady_calls)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
