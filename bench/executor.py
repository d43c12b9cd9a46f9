"""Throughput of gpt-char through the executor under precision maps and layouts.

    python bench/executor.py [--steps 50] [--batch-size 16] [--device auto|cpu|cuda]

Runs each configuration with ``JobRunner`` on a local Ray (one rank per GPU on a GPU
machine, one per core on CPU), skips 5 warm-up steps, and writes
``bench/out/executor-<device>.json`` with the median step time, samples/s, loss and
bytes per configuration. Layouts needing more ranks than devices are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from autotune.core import CompressionSpec, JobConfig, Layout, PrecisionMap
from autotune.executor.runner import JobRunner, RunnerConfig, ensure_ray

WARMUP = 5


def configs() -> list[tuple[str, JobConfig]]:
    out = []
    for precision in ("fp32", "bf16", "fp8"):
        out.append(
            (
                f"dp1 {precision}",
                JobConfig(layout=Layout(world_size=1), precision=PrecisionMap.uniform(precision)),
            )
        )
    for name, compression in (
        ("none", CompressionSpec()),
        ("topk:0.01", CompressionSpec(kind="topk", ratio=0.01)),
        ("int8", CompressionSpec(kind="int8")),
    ):
        out.append(
            (
                f"dp2 {name} bf16",
                JobConfig(
                    layout=Layout(world_size=2),
                    precision=PrecisionMap.uniform("bf16"),
                    compression=compression,
                ),
            )
        )
    out.append(
        (
            "tp2 bf16",
            JobConfig(
                layout=Layout(world_size=2, dp=1, tp=2), precision=PrecisionMap.uniform("bf16")
            ),
        )
    )
    out.append(
        (
            "pp2 bf16",
            JobConfig(
                layout=Layout(world_size=2, dp=1, pp=2, micro_batches=4),
                precision=PrecisionMap.uniform("bf16"),
            ),
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    slots = torch.cuda.device_count() if device == "cuda" else (os.cpu_count() or 1)
    ensure_ray(num_cpus=max(slots, 2))
    rows = []
    for name, config in configs():
        if config.world_size > slots:
            rows.append({"config": name, "skipped": f"needs {config.world_size} devices"})
            continue
        started = time.perf_counter()
        run = RunnerConfig(
            task="gpt-char",
            steps=args.steps + WARMUP,
            batch_size=args.batch_size,
            seed=args.seed,
            device=device,
        )
        result = JobRunner(run, config).run()
        step = statistics.median(result.step_times_s[WARMUP:])
        rows.append(
            {
                "config": name,
                "step_time_s_median": step,
                "samples_per_s": args.batch_size / step,
                "tokens_per_s": args.batch_size * 64 / step,
                "loss_last": result.losses[-1],
                "bytes_sent": result.bytes_sent,
                "bytes_dense": result.bytes_dense,
                "power_watts_mean": statistics.fmean(result.power_watts)
                if result.power_watts
                else None,
                "wall_s": time.perf_counter() - started,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    report = {
        "device": device,
        "device_name": name,
        "torch": torch.__version__,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "rows": rows,
    }
    out = Path(__file__).parent / "out" / f"executor-{device}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
