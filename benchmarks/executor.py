"""Throughput of gpt-char through the executor under precision maps and layouts.

    python bench/executor.py [--steps 50] [--batch-size 16] [--device auto|cpu|cuda]
                             [--json FILE]

Runs each configuration with ``JobRunner`` on a local Ray (one rank per GPU on a GPU
machine, one per core on CPU), skips 5 warm-up steps, and writes
``bench/out/executor-<device>.json`` with the median step time, samples/s, loss and
bytes per configuration. Layouts needing more ranks than devices are skipped.

    python bench/executor.py --no-ray [--models gpt-char,gpt-85m] [--precisions
        fp32,bf16,fp8] [--fp8-modes auto,emulated] [--steps 20] [--warmup 5] ...

drives one ``RankWorker`` in this process instead (world size 1, a one-member process
group on a free localhost port; no Ray): each model under ``PrecisionMap.uniform`` of
each precision, reporting the step time (synchronised), samples/s, tokens/s, peak
memory, the fp8 path that ran (``scaled_mm`` or ``emulated``, and how many fp8 Linear
calls took each) and the NVML power the worker reads each step. ``gpt-85m`` is
gpt-char's model at GPT-2-small shape (12 layers, width 768, 12 heads, context 256);
``gpt-tiny`` a 2-layer one for CPU dry runs. ``--fp8-modes auto,emulated`` runs fp8 once
with the device's own choice and once forced to the emulation, to compare them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune.benchmarks import OUT
from autotune.catalog.tasks import GPTConfig
from autotune.core import CompressionSpec, JobConfig, Layout, PrecisionMap
from autotune.executor.tasks import GPTChar

WARMUP = 5


class GPT85M(GPTChar):
    """gpt-char's task at GPT-2-small shape: 12 x 768, 12 heads, context 256 (85M
    parameters in the blocks, 86M in all with the byte vocabulary)."""

    name = "gpt-85m"
    CONFIG = GPTConfig(layers=12, width=768, heads=12, context=256, batch_size=32)

    def __init__(self, *, batch_size: int | None = None, config: GPTConfig | None = None) -> None:
        super().__init__(batch_size=batch_size, config=config or self.CONFIG)


class GPTTiny(GPT85M):
    """A 2-layer stand-in for ``gpt-85m`` on a CPU (dry runs of the GPU suite)."""

    name = "gpt-tiny"
    CONFIG = GPTConfig(layers=2, width=64, heads=2, context=32, batch_size=4)


MODELS: dict[str, str] = {
    "gpt-char": "gpt-char",
    "gpt-85m": f"{Path(__file__).resolve()}:GPT85M",
    "gpt-tiny": f"{Path(__file__).resolve()}:GPTTiny",
}


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


# ------------------------------------------------------------------------- in process


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_in_process(
    model: str,
    precision: str,
    fp8_request: str,
    *,
    device: str,
    steps: int,
    warmup: int,
    batch_size: int | None,
    seed: int,
    threads: int,
) -> dict[str, Any]:
    """One configuration on one ``RankWorker`` in this process; raises on failure."""
    from autotune.executor.local import single_rank
    from autotune.executor.precision import FP8_MODE_ENV
    from autotune.executor.reports import RankStep
    from autotune.executor.worker import WorkerSpec

    if fp8_request == "auto":
        os.environ.pop(FP8_MODE_ENV, None)
    else:
        os.environ[FP8_MODE_ENV] = fp8_request
    config = JobConfig(
        layout=Layout(world_size=1),
        precision=PrecisionMap.uniform(precision),  # type: ignore[arg-type]
    )
    spec = WorkerSpec(
        task=MODELS[model],
        config=config,
        seed=seed,
        batch_size=batch_size,
        device=device,
        kernel_backend="auto" if device == "cuda" else "reference",
        threads=threads,
    )
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with single_rank(spec) as worker:
        task: Any = worker.task
        batch = int(task.batch_size)
        tokens_per_sample = int(getattr(task, "seq_len", 1))
        parameters = sum(p.numel() for p in worker.model.parameters())
        metrics: list[RankStep] = []
        times: list[float] = []
        for i in range(warmup + steps):
            _sync(device)
            t0 = time.perf_counter()
            m = worker.step()
            _sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                metrics.append(m)
        step = statistics.median(times)
        power = [m.power_watts for m in metrics if m.power_watts is not None]
        losses = [m.loss for m in metrics if m.loss is not None]
        row = {
            "model": model,
            "precision": precision,
            "fp8_request": fp8_request if precision == "fp8" else None,
            "parameters": parameters,
            "batch_size": batch,
            "tokens_per_sample": tokens_per_sample,
            "steps": steps,
            "warmup": warmup,
            "step_time_s_median": step,
            "step_time_s_min": min(times),
            "worker_step_time_s_median": statistics.median(m.step_time_s for m in metrics),
            "samples_per_s": batch / step,
            "tokens_per_s": batch * tokens_per_sample / step,
            "peak_memory_bytes": max(m.peak_memory_bytes for m in metrics),
            "fp8_mode": metrics[-1].fp8_mode,
            "fp8_calls": dict(worker.precision.fp8_calls) if precision == "fp8" else None,
            "fp8_error": worker.precision.fp8_error,
            "precision_after": worker.precision.precision.as_dict(),
            "events": [e for m in metrics for e in m.events][:20],
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "power_watts_mean": statistics.fmean(power) if power else None,
            "power_watts_max": max(power) if power else None,
            "power_samples": len(power),
            "wall_s": time.perf_counter() - started,
        }
    del worker
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main_in_process(
    args: argparse.Namespace, device: str, write: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Runs the plan; calls ``write`` with the report so far after each configuration (a
    run cut short keeps what it measured)."""
    rows: list[dict[str, Any]] = []
    plan: list[tuple[str, str, str]] = []
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            modes = args.fp8_modes.split(",") if precision == "fp8" else ["auto"]
            plan += [(model, precision, mode) for mode in modes]
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    for model, precision, mode in plan:
        name = f"{model} {precision}" + (f" fp8={mode}" if precision == "fp8" else "")
        if deadline is not None and time.monotonic() > deadline:
            rows.append({"config": name, "skipped": f"over the {args.budget_s} s budget"})
            continue
        print(f"running {name}", file=sys.stderr, flush=True)
        try:
            row = run_in_process(
                model,
                precision,
                mode,
                device=device,
                steps=args.steps,
                warmup=args.warmup,
                batch_size=args.batch_size,
                seed=args.seed,
                threads=args.threads,
            )
            rows.append({"config": name, **row})
        except Exception as exc:  # one configuration failing does not end the benchmark
            rows.append(
                {"config": name, "error": repr(exc), "traceback": traceback.format_exc()[-3000:]}
            )
        print(json.dumps(rows[-1]), flush=True)
        write({"mode": "in-process (no Ray), world size 1", "rows": rows})
    return {"mode": "in-process (no Ray), world size 1", "rows": rows}


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine() or "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="timed steps (default 50; 20 with --no-ray)")
    parser.add_argument(
        "--batch-size",
        type=int,
        help="global batch (default 16 on Ray; with --no-ray each model's own: "
        "gpt-char 16, gpt-85m 32, gpt-tiny 4)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="where to write the report")
    parser.add_argument(
        "--no-ray",
        "--in-process",
        dest="no_ray",
        action="store_true",
        help="drive one RankWorker in this process (world size 1), no Ray",
    )
    parser.add_argument("--models", default="gpt-char,gpt-85m", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--precisions", default="fp32,bf16,fp8")
    parser.add_argument(
        "--fp8-modes",
        default="auto",
        help="fp8 paths to run: auto (the device's choice), scaled_mm, emulated",
    )
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (--no-ray)")
    parser.add_argument(
        "--budget-s", type=float, help="skip configurations started after this many seconds"
    )
    args = parser.parse_args()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.no_ray:
        args.steps = args.steps or 20
        started = time.perf_counter()
        out = args.json or OUT / f"executor-inprocess-{device}.json"
        out.parent.mkdir(parents=True, exist_ok=True)

        def write(part: dict[str, Any]) -> None:
            report = {
                "device": device,
                "device_name": _device_name(device),
                "torch": torch.__version__,
                "steps": args.steps,
                "warmup": args.warmup,
                "seed": args.seed,
                **part,
                "wall_s": time.perf_counter() - started,
            }
            out.write_text(json.dumps(report, indent=1) + "\n")

        write(main_in_process(args, device, write))
        print(f"wrote {out}")
        return
    args.steps = args.steps or 50
    args.batch_size = args.batch_size or 16
    main_ray(args, device)


def main_ray(args: argparse.Namespace, device: str) -> None:
    from autotune.executor.runner import JobRunner, RunnerConfig
    from autotune.ray_session import ensure_ray

    slots = torch.cuda.device_count() if device == "cuda" else (os.cpu_count() or 1)
    ensure_ray(num_cpus=max(slots, 2))
    rows: list[dict[str, Any]] = []
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
    name = _device_name(device)
    report = {
        "device": device,
        "device_name": name,
        "torch": torch.__version__,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "rows": rows,
    }
    out = args.json or OUT / f"executor-{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
