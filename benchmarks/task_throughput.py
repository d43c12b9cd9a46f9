"""Does the executor report the throughput a job really has? A task is timed from outside
the executor and compared with what the executor reports.

    python bench/task_throughput.py [--task FILE.py:Class] [--steps 30] [--seed 0]

For dp1, dp2 and pp2 (2 micro-batches) the task trains ``--steps`` steps through
``JobRunner``; the step callbacks' wall-clock times give an independent throughput,
samples per step x steps / wall time, over steps 3 to N-1 (the first two warm up, the last
ends with the final checkpoint). Samples per step come from the task's ``batch_size``, or
are counted from its batches, exactly as the executor counts them. The default task
(``tests/data/user_task.py:TinyLM``) is a user's byte-level language model with no
``batch_size``. Prints one JSON object and writes it to
``bench/out/task_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

from autotune.benchmarks import REPO
from autotune.core import JobConfig, Layout
from autotune.executor.runner import JobRunner, RunnerConfig
from autotune.ray_session import ensure_ray

LAYOUTS = {"dp1": (1, 1, 1), "dp2": (2, 1, 1), "pp2": (1, 2, 2)}


def measure(task: str, steps: int, seed: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, (dp, pp, micro) in LAYOUTS.items():
        config = JobConfig(layout=Layout(world_size=dp * pp, dp=dp, pp=pp, micro_batches=micro))
        done_at: list[float] = []
        result = JobRunner(
            RunnerConfig(task=task, steps=steps, seed=seed),
            config,
            on_step=lambda *_, times=done_at: times.append(time.perf_counter()),
        ).run()
        summary = result.summary()
        timed = result.samples[2:-1]
        independent = sum(timed) / (done_at[-2] - done_at[1])
        rows[name] = {
            "samples_per_step": summary["samples_per_step"],
            "reported_samples_per_s": round(summary["samples_per_s"], 1),
            "independent_samples_per_s": round(independent, 1),
            "ratio": round(summary["samples_per_s"] / independent, 3),
            "tokens_per_s": summary["tokens_per_s"] and round(summary["tokens_per_s"], 1),
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default=str(REPO / "tests/data/user_task.py") + ":TinyLM")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 5:
        parser.error("--steps must be >= 5 (two warm-up steps, the final checkpoint)")
    started = ensure_ray(num_cpus=8)
    try:
        report = {
            "task": args.task,
            "steps": args.steps,
            "seed": args.seed,
            "machine": platform.machine(),
            "layouts": measure(args.task, args.steps, args.seed),
        }
    finally:
        if started:
            import ray

            ray.shutdown()
    out = REPO / "bench" / "out" / "task_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
