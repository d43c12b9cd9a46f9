"""Steps to a target loss at a larger batch, at the task's learning rate and at the rate
scaled by the batch's gain r = (M / M0) (phi + M0) / (phi + M) (AdaScale;
``autotune.perf.model.batch_gain``), against the performance model's prediction (the
batch's steps over r).

    python bench/batch_learning_rate.py [--task resnet-mini --task ctr-synthetic]
        [--scale 4] [--n-steps 150] [--seeds 0 1] [--dp 2]

For each task and seed, plain fp32 DDP at the task's batch M0 trains ``--n-steps`` (N)
steps; the target is its loss at step N (the 10-step mean, as everywhere), and its own
steps to it the first step whose mean is at or below it. At ``--scale`` x M0 it then
trains up to N steps four ways: at the task's learning rate (``fixed``), at the rate x
sqrt(r) and x r with phi the task's catalog noise scale (``sqrt_gain``, ``gain``), and
as the daemon trains such a job (``measured``: ``WorkerSpec.lr_reference_batch``, r from
the noise scale the ranks measure, the catalog's until then). Ranks run as local
processes over gloo. One JSON object on stdout and in
``bench/out/batch_learning_rate.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO, publish
from autotune.catalog.tasks import task_profile
from autotune.core import JobConfig, Layout
from autotune.executor.efficiency import WINDOW, reached, smoothed
from autotune.executor.local import run_local
from autotune.executor.quality import BatchScaling
from autotune.executor.tasks import load_task
from autotune.executor.worker import WorkerSpec


def _steps(spec: WorkerSpec, n: int, target: float) -> tuple[int | None, list[dict[str, Any]]]:
    run = run_local(spec, n, save=False, timeout_s=3600.0)
    events = [e for r in run.reports[0] for e in r.events if e["kind"] == "learning_rate"]
    return reached(smoothed(run.losses()), target), events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", action="append", help="built-in task (repeatable)")
    parser.add_argument("--scale", type=int, default=4, help="the larger batch, x the task's")
    parser.add_argument("--n-steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "out" / "batch_learning_rate.json"
    )
    args = parser.parse_args(argv)
    if args.n_steps < 2 * WINDOW:
        parser.error(f"--n-steps must be >= {2 * WINDOW}")
    if args.scale < 2:
        parser.error("--scale must be >= 2")
    n, rows = args.n_steps, []
    config = JobConfig(layout=Layout(dp=args.dp, world_size=args.dp))
    for task in args.task or ["resnet-mini", "ctr-synthetic"]:
        profile = task_profile(task)
        m0, phi = profile.reference_batch, profile.noise_scale
        big = args.scale * m0
        rate = float(getattr(load_task(task), "learning_rate", 1e-3))  # as the ranks take it
        gain = BatchScaling(reference_batch=m0, batch=big, prior=phi).gain  # the ranks' r
        for seed in args.seeds:
            began = time.time()
            spec = WorkerSpec(task=task, config=config, batch_size=m0, seed=seed)
            dense = smoothed(run_local(spec, n, save=False, timeout_s=3600.0).losses())
            target = dense[n - 1]
            base = reached(dense, target)
            assert base is not None
            row: dict[str, Any] = {
                "task": task,
                "seed": seed,
                "batch": m0,
                "large_batch": big,
                "catalog_noise_scale": phi,
                "gain": gain,
                "target_loss": target,
                "dense_steps": base,
                "predicted_steps": base / gain,
            }
            for arm, factor in (("fixed", 1.0), ("sqrt_gain", math.sqrt(gain)), ("gain", gain)):
                large = WorkerSpec(
                    task=task,
                    config=config,
                    batch_size=big,
                    seed=seed,
                    learning_rate=rate * factor,
                )
                row[f"steps_{arm}"], _ = _steps(large, n, target)
            measured = WorkerSpec(
                task=task,
                config=config,
                batch_size=big,
                seed=seed,
                lr_reference_batch=m0,
                noise_prior=phi if phi > 0 else None,
            )
            row["steps_measured"], events = _steps(measured, n, target)
            row["measured_gains"] = [(e["step"], e["gain"], e["noise_scale"]) for e in events]
            row["seconds"] = time.time() - began
            print(json.dumps(row), flush=True)
            rows.append(row)
    publish(
        "batch_learning_rate",
        args.out,
        {"n_steps": n, "dp": args.dp, "scale": args.scale, "window": WINDOW, "rows": rows},
    )
    return 0
