"""Online fitting on the executor: train a task for real under a few layouts, fit its
throughput model online from those measured steps, predict the other configurations.

Each configuration of ``autotune calibrate``'s grid (``executor.calibrate.GRID``: dp,
tp and pp up to 2 ranks, gradient compression, fp32 and bf16; for ``mlp-synthetic``,
which has no transformer shape, the data-parallel part of it) is trained for real
(``--steps`` measured steps after 2 of warm-up, one rank per core) and its median step
time measured. Two layouts (1 rank; data parallel on 2 ranks), in fp32 or in fp32 and
bf16, feed an ``autotune.perf.online.OnlineFit`` started from the literature defaults on
the catalog's ``CPU`` device, as the daemon feeds a job's fit from its step metrics; the
fit then predicts every other configuration.
Reports each configuration's measured and predicted step time, the step-time MAPE over
the ones not observed, and the machine's load average before and after (the
measurements are only as good as the machine is quiet).

    python bench/executor_online.py [--task gpt-char --task mlp-synthetic] [--steps 20]
        [--json-out bench/out/executor_online.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.catalog.tasks import BUILTIN_TASKS
from autotune.core import JobConfig
from autotune.executor.calibrate import GRID, measure
from autotune.perf.fit import mape
from autotune.perf.model import Coefficients, Shape
from autotune.perf.online import OnlineFit, StepSample
from autotune.ray_session import ensure_ray


def grid_for(task: str) -> list[JobConfig]:
    profile = BUILTIN_TASKS[task].profile
    assert profile is not None
    if profile.hidden_size:
        return list(GRID)
    return [c for c in GRID if c.layout.tp == 1 and c.layout.pp == 1]


def _observed(configs: list[JobConfig], precisions: tuple[str, ...]) -> list[int]:
    """Indices of the two plain layouts (1 rank; data parallel on 2) in ``precisions``."""
    return [
        i
        for i, c in enumerate(configs)
        if c.layout.tp == 1
        and c.layout.pp == 1
        and c.compression.kind == "none"
        and c.precision.ffn in precisions
    ]


OBSERVATIONS = {
    "two layouts, fp32": ("fp32",),
    "two layouts, fp32 and bf16": ("fp32", "bf16"),
}
"""What the fit sees: the 1-rank and 2-rank data-parallel layouts, in fp32 only (it must
guess bf16 from the catalog's CPU device), or in both precisions."""


def _fit(profile: Any, rows: list[tuple[JobConfig, float]], seen: list[int], batch: int) -> Any:
    fit = OnlineFit(profile, Coefficients())
    for i in seen:
        config, step_s = rows[i]
        fit.add(
            StepSample(
                shape=Shape(gpu_model="CPU", ranks_per_node=(config.world_size,)),
                config=config,
                global_batch=batch,
                step_s=step_s,
            )
        )
    return fit


def run_task(task: str, *, steps: int, seed: int) -> dict[str, Any]:
    built = BUILTIN_TASKS[task]
    profile = built.profile
    assert profile is not None
    batch = int(getattr(built.shape, "batch_size", profile.reference_batch))
    configs = grid_for(task)
    rows = []
    for i, config in enumerate(configs):
        began = time.perf_counter()
        m = measure(config, steps=steps, seed=seed, task=task, batch_size=batch)
        rows.append((config, m.step_time_s))
        print(
            f"  {task} [{i + 1}/{len(configs)}] {config.describe():32s} "
            f"{m.step_time_s * 1e3:8.2f} ms/step ({time.perf_counter() - began:.0f} s)",
            flush=True,
        )
    result: dict[str, Any] = {
        "task": task,
        "global_batch": batch,
        "measured": {c.describe(): round(t, 6) for c, t in rows},
        "observations": {},
    }
    for name, precisions in OBSERVATIONS.items():
        seen = _observed(configs, precisions)
        fit = _fit(profile, rows, seen, batch)
        table: list[dict[str, Any]] = []
        predicted, measured = [], []
        for i, (config, step_s) in enumerate(rows):
            shape = Shape(gpu_model="CPU", ranks_per_node=(config.world_size,))
            guess = fit.predict(config, shape, batch).step_s
            table.append(
                {
                    "config": config.describe(),
                    "observed": i in seen,
                    "measured_step_s": round(step_s, 6),
                    "predicted_step_s": round(guess, 6),
                }
            )
            if i not in seen:
                predicted.append(guess)
                measured.append(step_s)
        # The measure: the other layouts of the grid (plain fp32 data, tensor or
        # pipeline parallel), not the other precisions and compressions.
        layouts = [
            i
            for i, (c, _) in enumerate(rows)
            if i not in seen and c.compression.kind == "none" and c.precision.ffn == "fp32"
        ]
        result["observations"][name] = {
            "observed": [configs[i].describe() for i in seen],
            "fit": fit.summary(),
            "configs": table,
            "mape_step_time_unobserved": round(mape(predicted, measured), 4),
            "unobserved": len(measured),
            "mape_step_time_other_layouts": round(
                mape(
                    [table[i]["predicted_step_s"] for i in layouts],
                    [table[i]["measured_step_s"] for i in layouts],
                ),
                4,
            )
            if layouts
            else None,
            "other_layouts": [configs[i].describe() for i in layouts],
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", choices=sorted(BUILTIN_TASKS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    tasks = args.task or ["gpt-char", "mlp-synthetic"]
    load_before = os.getloadavg()
    started = ensure_ray(num_cpus=2)
    try:
        report: dict[str, Any] = {
            "steps": args.steps,
            "cores": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "tasks": {},
        }
        for task in tasks:
            result = run_task(task, steps=args.steps, seed=args.seed)
            report["tasks"][task] = result
            for name, row in result["observations"].items():
                layouts = row["mape_step_time_other_layouts"]
                print(
                    f"{task}, {name} observed: step-time MAPE on the other "
                    f"{row['unobserved']}: {row['mape_step_time_unobserved']:.1%}"
                    + (
                        f"; on the other layouts ({', '.join(row['other_layouts'])}): {layouts:.1%}"
                        if layouts is not None
                        else ""
                    ),
                    flush=True,
                )
        report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if started:
            import ray

            ray.shutdown()
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
