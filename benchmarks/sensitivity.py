"""Compression sensitivity over real tasks, from the steps to a target each task took
under each compression (``bench/quality_validation.py``'s JSON), fitted as the simulated
cluster draws it (``autotune.perf.sensitivity``).

    python bench/quality_validation.py --task gpt-char --task mlp-synthetic \\
        --task resnet-mini --task ctr-synthetic --setting topk:0.1 --setting topk:0.01 \\
        --setting powersgd:1 --setting powersgd:2 --setting powersgd:4 --setting int8 \\
        --setting fp8 --setting precision=bf16 --setting precision=fp16 \\
        --n-steps 150 --seeds 0 1 2 --limit 2 --out bench/out/sensitivity_runs.json
    python bench/sensitivity.py bench/out/sensitivity_runs.json [--write]

Each task's efficiency under a setting is the median over its seeds as ``autotune
calibrate --efficiency`` takes it (``autotune.executor.efficiency.task_efficiency``). The
report gives each task's fitted sensitivity and how well the two shapes fit its runs (the
absolute error of the efficiency they give, beside the catalog's), the spread over tasks
against the catalog's constants, and a leave-one-out check: each task's sensitivity
against the spread fitted to the others (the share of drawn jobs at or below it; between
0.05 and 0.95 is a task the others' spread could have drawn). ``--write`` saves the
tasks' efficiencies as the measurement autotune ships (``autotune/data/sensitivity.json``;
``--write PATH``: elsewhere). One JSON object on stdout and in
``bench/out/sensitivity.json``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT, REPO, publish
from autotune.core import CompressionSpec, ModelProfile
from autotune.executor.efficiency import task_efficiency
from autotune.perf.model import CATALOG_SENSITIVITY, compression_efficiency
from autotune.perf.sensitivity import SensitivitySpread, fit, task_sensitivity

SHIPPED = REPO / "autotune" / "data" / "sensitivity.json"


def efficiencies(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Task -> setting -> the median efficiency over its seeds."""
    runs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        runs[row["task"]][row["setting"]].append(row["efficiency"])
    return {
        task: {setting: round(task_efficiency(values), 4) for setting, values in found.items()}
        for task, found in runs.items()
    }


def _compressions(found: dict[str, float]) -> dict[str, float]:
    return {
        str(CompressionSpec.parse(k)): v for k, v in found.items() if not k.startswith("precision=")
    }


def _spread(spread: SensitivitySpread) -> dict[str, Any]:
    return {
        kind: {
            "pays_nothing": round(part.pays_nothing, 3),
            "log_mean": round(part.log_mean, 3),
            "log_sd": round(part.log_sd, 3),
            "median": round(part.median, 4),
            "catalog": getattr(CATALOG_SENSITIVITY, kind),
        }
        for kind, part in (("topk", spread.topk), ("powersgd", spread.powersgd))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path, help="bench/quality_validation.py's JSON")
    parser.add_argument(
        "--write",
        type=Path,
        nargs="?",
        const=SHIPPED,
        help=f"save the tasks' efficiencies as a measurement file (default: {SHIPPED})",
    )
    parser.add_argument("--out", type=Path, default=OUT / "sensitivity.json")
    args = parser.parse_args(argv)
    measured = json.loads(args.runs.read_text())
    found = efficiencies(measured["rows"])
    compressions = {task: _compressions(values) for task, values in found.items()}
    spread = fit(compressions)
    tasks: dict[str, Any] = {}
    for task, values in sorted(found.items()):
        own = task_sensitivity(compressions[task])
        assert own is not None
        # What the two shapes give back for each measured compression.
        shaped = ModelProfile(
            name=task,
            parameters=1,
            flops_per_sample=1.0,
            activation_bytes_per_sample=0.0,
            num_layers=1,
            compression_sensitivity=own,
        )
        fitted = {
            name: round(compression_efficiency(CompressionSpec.parse(name), shaped), 4)
            for name in compressions[task]
        }
        rest = {t: v for t, v in compressions.items() if t != task}
        others = fit(rest) if rest else None
        tasks[task] = {
            "efficiency": values,
            "sensitivity": {"topk": round(own.topk, 4), "powersgd": round(own.powersgd, 4)},
            "shapes_give": fitted,
            "catalog_gives": {
                name: round(compression_efficiency(CompressionSpec.parse(name)), 4)
                for name in compressions[task]
            },
            "held_out_cdf": None
            if others is None
            else {
                "topk": round(others.topk.cdf(own.topk), 3),
                "powersgd": round(others.powersgd.cdf(own.powersgd), 3),
            },
        }
    # How far each pricing is from what was measured, over the top-k and PowerSGD runs
    # (a run faster than dense SGD counts as 1, as the fit takes it).
    errors: dict[str, list[float]] = {"shapes": [], "catalog": []}
    for row in tasks.values():
        for name in row["shapes_give"]:
            if CompressionSpec.parse(name).kind in ("topk", "powersgd"):
                measured_value = min(1.0, row["efficiency"][name])
                errors["shapes"].append(abs(row["shapes_give"][name] - measured_value))
                errors["catalog"].append(abs(row["catalog_gives"][name] - measured_value))
    report = publish(
        "sensitivity",
        args.out,
        {
            "runs": str(args.runs),
            "protocol": {k: measured.get(k) for k in ("n_steps", "dp", "limit_steps", "window")},
            "tasks": tasks,
            "spread": _spread(spread),
            "absolute_error": {
                k: {"mean": round(sum(v) / len(v), 4), "worst": round(max(v), 4), "runs": len(v)}
                for k, v in errors.items()
                if v
            },
        },
    )
    if args.write is not None:
        shipped = {
            "measured": report["date"],
            "host": report["host"],
            "how": "python bench/quality_validation.py ... then python bench/sensitivity.py "
            "RUNS --write (see autotune.benchmarks.sensitivity)",
            "protocol": report["protocol"],
            "tasks": {
                task: {
                    "compression_efficiency": compressions[task],
                    "precision_efficiency": {
                        k.split("=", 1)[1]: v
                        for k, v in found[task].items()
                        if k.startswith("precision=")
                    },
                }
                for task in sorted(found)
            },
        }
        args.write.write_text(json.dumps(shipped, indent=2) + "\n")
    return 0
