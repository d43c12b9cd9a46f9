"""What the catalog's real model sizes cost to train: one rank of the executor
(``RankWorker``, in this process, a one-member gloo or NCCL group, no Ray) trains a
built-in task for a few steps at the shape its catalog profile is counted from.

    python bench/model_sizes.py [--task gpt-125m] [--steps 4] [--batch-size 2]
                                [--threads 2] [--device cpu|cuda] [--seed 0]

Per task: parameters (the built model's and the profile's, which must agree), the
context, the step times, samples/s and tokens/s from the median step after the first
(``--warmup``), the FLOPs/s the profile's FLOPs per sample imply at that rate, the
losses, and the peak memory (CPU: the process's peak resident set, which includes
building the model and, with several ``--task``, every task before; GPU: peak
allocated). ``--task`` may be given several times. Prints
one JSON object and writes it to ``bench/out/model_sizes.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from autotune.benchmarks import OUT
from autotune.catalog.tasks import BUILTIN_TASKS, trainable_tasks
from autotune.core import JobConfig, Layout
from autotune.executor.local import single_rank
from autotune.executor.worker import WorkerSpec


def measure(
    task: str, *, steps: int, warmup: int, batch_size: int, threads: int, device: str, seed: int
) -> dict[str, Any]:
    profile = BUILTIN_TASKS[task].profile
    spec = WorkerSpec(
        task=task,
        config=JobConfig(layout=Layout(world_size=1)),
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
        build_s = time.perf_counter() - started
        seq_len = getattr(worker.task, "seq_len", None)
        built = sum(p.numel() for p in worker.model.parameters())
        rows = [worker.step() for _ in range(steps)]
    del worker  # frees the model before the next task
    times = [r.step_time_s for r in rows]
    step_s = statistics.median(times[warmup:])
    samples_per_s = batch_size / step_s
    return {
        "task": task,
        "parameters": built,
        "profile_parameters": profile.parameters,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "build_s": round(build_s, 2),
        "step_times_s": [round(t, 3) for t in times],
        "median_step_s": round(step_s, 3),
        "samples_per_s": round(samples_per_s, 3),
        "tokens_per_s": round(samples_per_s * seq_len, 1) if seq_len else None,
        "model_gflops_per_s": round(samples_per_s * profile.flops_per_sample / 1e9, 2),
        "losses": [None if r.loss is None else round(r.loss, 4) for r in rows],
        "peak_memory_gib": round(max(r.peak_memory_bytes for r in rows) / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--task",
        action="append",
        choices=trainable_tasks(),
        help="a built-in task the executor trains (repeatable; default gpt-125m)",
    )
    parser.add_argument("--steps", type=int, default=4, help="steps per task (default 4)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="first steps left out of the rate (default 1)"
    )
    parser.add_argument("--batch-size", type=int, default=2, help="global batch (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT / "model_sizes.json")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must be more than --warmup")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here")
    tasks = args.task or ["gpt-125m"]
    report = {
        "machine": platform.machine(),
        "device": args.device
        if args.device == "cpu"
        else torch.cuda.get_device_name(0),  # the GPU's model
        "torch": torch.__version__,
        "threads": args.threads,
        "seed": args.seed,
        "steps": args.steps,
        "warmup": args.warmup,
        "tasks": [
            measure(
                task,
                steps=args.steps,
                warmup=args.warmup,
                batch_size=args.batch_size,
                threads=args.threads,
                device=args.device,
                seed=args.seed,
            )
            for task in tasks
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
