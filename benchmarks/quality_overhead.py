"""What measuring a job's training quality costs (``autotune.executor.quality``): the same
data-parallel job trained with the measurements on and off, interleaved, on local
processes over gloo.

    python bench/quality_overhead.py [--task gpt-char:64 --task resnet-50:8]
        [--compression none --compression topk:0.01 --compression powersgd:4]
        [--steps 40] [--repeats 3] [--dp 2]

For each task and compression it trains ``--repeats`` pairs of runs (off, on), each
``--steps`` steps. Two figures of the overhead: ``measured_share``, the seconds a rank
timed itself measuring over its step (median and mean over the steps after ``WARMUP``:
the reference steps are in the mean), and ``overhead``, the pairs' median ratio of the
median step (the slowest rank's own) on to off, less 1 (noisier: two ranks share the
host's cores with everything else on it).
With the measurements on it also reports what they measured at the end: the noise scale,
the compression's cosine and relative error, and the reference steps taken. One JSON
object on stdout and in ``bench/out/quality_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO, publish
from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.executor.local import run_local
from autotune.executor.quality import NoiseScale
from autotune.executor.worker import WorkerSpec

WARMUP = 5


def _run(task: str, batch: int, compression: str, dp: int, steps: int, measure: bool) -> Any:
    config = JobConfig(
        layout=Layout(dp=dp, world_size=dp), compression=CompressionSpec.parse(compression)
    )
    spec = WorkerSpec(task=task, config=config, batch_size=batch, measure_quality=measure)
    return run_local(spec, steps, save=False)


def _median_step(run: Any) -> float:
    per_step = [
        max(steps)
        for steps in zip(*([r.step_time_s for r in rank] for rank in run.reports), strict=True)
    ]
    return float(statistics.median(per_step[WARMUP:]))


def _measured(run: Any, batch: int, dp: int) -> dict[str, Any]:
    reports = run.reports[0]
    noise = NoiseScale()
    cosines, errors, references, shares = [], [], 0, []
    for step, report in enumerate(reports):
        q = report.quality
        if q is None:
            continue
        if step >= WARMUP:
            shares.append(q.measure_s / report.step_time_s)
        if q.dense_sq is not None and dp > 1:
            noise.update(q.replica_sq, q.dense_sq, batch / dp, batch, step=step)
        if q.reference_s is not None:
            references += 1
        if q.cosine is not None:
            cosines.append(q.cosine)
            errors.append(q.relative_error)
    return {
        "measured_share": statistics.median(shares) if shares else None,
        "measured_share_mean": statistics.fmean(shares) if shares else None,
        "noise_scale": noise.value,
        "noise_measurements": noise.measurements,
        "reference_steps": references,
        "cosine_median": statistics.median(cosines) if cosines else None,
        "relative_error_median": statistics.median(errors) if errors else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", action="append", help="TASK:GLOBAL_BATCH (repeatable)")
    parser.add_argument(
        "--compression", action="append", help="repeatable; default none, topk:0.01, powersgd:4"
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "out" / "quality_overhead.json"
    )
    args = parser.parse_args(argv)
    if args.steps <= WARMUP + 2:
        parser.error(f"--steps must be > {WARMUP + 2}")
    tasks = args.task or ["gpt-char:64", "resnet-50:8"]
    compressions = args.compression or ["none", "topk:0.01", "powersgd:4"]
    rows = []
    for item in tasks:
        task, _, batch_text = item.partition(":")
        batch = int(batch_text or 64)
        for compression in compressions:
            ratios, off_s, on_s, measured = [], [], [], {}
            began = time.time()
            for _ in range(args.repeats):
                off = _median_step(_run(task, batch, compression, args.dp, args.steps, False))
                run = _run(task, batch, compression, args.dp, args.steps, True)
                on = _median_step(run)
                measured = _measured(run, batch, args.dp)
                ratios.append(on / off)
                off_s.append(off)
                on_s.append(on)
            row = {
                "task": task,
                "batch": batch,
                "compression": compression,
                "step_s_off": statistics.median(off_s),
                "step_s_on": statistics.median(on_s),
                "overhead": statistics.median(ratios) - 1,
                "overhead_per_pair": [r - 1 for r in ratios],
                **measured,
                "seconds": round(time.time() - began, 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    publish(
        "quality_overhead",
        args.out,
        {
            "dp": args.dp,
            "steps": args.steps,
            "repeats": args.repeats,
            "rows": rows,
        },
    )
    return 0
