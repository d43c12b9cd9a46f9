"""Planner decision-round time by cluster size (`python bench/planner_scale.py`).

Clusters of 8-GPU A100 nodes at 64, 256, 1,024 and 4,096 GPUs; a queue of 1-8 GPU jobs
(seeded) asking for 1.2x the cluster; one ``plan()`` call each, timed, median of
``--repeat``. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from autotune.catalog.devices import node_info
from autotune.core import JobSpec
from autotune.planner import plan


def one(gpus: int, seed: int) -> tuple[float, int, int]:
    rng = np.random.default_rng(seed)
    nodes = [
        node_info(f"n{i}", gpu_model="A100", gpu_count=8, cpu_milli=128_000, memory_mib=1 << 20)
        for i in range(gpus // 8)
    ]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = {}
    for gpus in (64, 256, 1024, 4096):
        runs = [one(gpus, args.seed + r) for r in range(args.repeat)]
        out[str(gpus)] = {
            "median_s": round(statistics.median(r[0] for r in runs), 4),
            "jobs": runs[0][1],
            "placed": runs[0][2],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
