"""fp16 that overflows, with and without autotune's numerical health: plain dynamic loss
scaling (every non-finite step skipped and the scale backed off, nothing else), plus the
fall-back of a class that produced NaN/Inf, plus the gradient-norm guard
(``autotune.executor.quality``), against fixed fp32 and bf16 maps.

    python bench/precision_guard.py [--task bench/tasks/large_targets.py:LargeTargets]
        [--steps 600] [--seeds 0 1 2]

Each arm trains the task on one local rank for ``--steps`` steps and reports the share
of steps skipped for a non-finite value (the NaN-step rate), the last and the lowest
loss (mean of the last 20 steps), and the precision changes the run made. The default
task regresses targets beyond fp16's range (``bench/tasks/large_targets.py``); pass
``--task mlp-synthetic`` for a task that does not overflow (the guard should stay
quiet). One JSON object on stdout and in ``bench/out/precision_guard.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO, publish
from autotune.core import JobConfig, Layout, PrecisionMap
from autotune.executor.local import run_local
from autotune.executor.worker import WorkerSpec

ARMS: dict[str, dict[str, Any]] = {
    "fp32": {"precision": "fp32", "nonfinite_fallback": True, "grad_norm_guard": True},
    "bf16": {"precision": "bf16", "nonfinite_fallback": True, "grad_norm_guard": True},
    "fp16 loss scaling only": {
        "precision": "fp16",
        "nonfinite_fallback": False,
        "grad_norm_guard": False,
    },
    "fp16 + fall-back": {"precision": "fp16", "nonfinite_fallback": True, "grad_norm_guard": False},
    "fp16 + fall-back + guard": {
        "precision": "fp16",
        "nonfinite_fallback": True,
        "grad_norm_guard": True,
    },
}


def run_arm(task: str, arm: dict[str, Any], steps: int, seed: int) -> dict[str, Any]:
    config = JobConfig(
        layout=Layout(dp=1, world_size=1), precision=PrecisionMap.uniform(arm["precision"])
    )
    spec = WorkerSpec(
        task=task,
        config=config,
        seed=seed,
        nonfinite_fallback=arm["nonfinite_fallback"],
        grad_norm_guard=arm["grad_norm_guard"],
    )
    reports = run_local(spec, steps, save=False).reports[0]
    skipped = sum(1 for r in reports if r.quality is None)
    losses = [r.loss for r in reports if r.loss is not None]
    tail = losses[-20:]
    return {
        "nan_step_rate": skipped / len(reports),
        "skipped_steps": skipped,
        "loss_last20": statistics.fmean(tail) if tail else None,
        "changes": [
            {k: e.get(k) for k in ("step", "kind", "module_class", "from", "to")}
            for r in reports
            for e in r.events
            if e["kind"] in ("nonfinite", "grad_norm_growth")
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="bench/tasks/large_targets.py:LargeTargets")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "precision_guard.json")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    task = args.task
    if ".py:" in task and not Path(task.split(":")[0]).is_absolute():
        task = str(REPO / task)
    rows = []
    for name, arm in ARMS.items():
        began = time.time()
        runs = [run_arm(task, arm, args.steps, seed) for seed in args.seeds]
        finite = [r["loss_last20"] for r in runs if r["loss_last20"] is not None]
        row = {
            "arm": name,
            **arm,
            "nan_step_rate_median": statistics.median(r["nan_step_rate"] for r in runs),
            "nan_step_rate_max": max(r["nan_step_rate"] for r in runs),
            "loss_last20_median": statistics.median(finite) if finite else None,
            "runs": runs,
            "seconds": round(time.time() - began, 1),
        }
        print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
        rows.append(row)
    publish(
        "precision_guard",
        args.out,
        {
            "task": args.task,
            "steps": args.steps,
            "seeds": args.seeds,
            "arms": rows,
        },
    )
    return 0
