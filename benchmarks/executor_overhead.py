"""What the executor costs on top of PyTorch: the same task, model, batch, optimiser and
seed trained four ways, each rank on the same number of threads.

    python bench/executor_overhead.py [--steps 40] [--threads 1] [--device cpu|cuda]

(a) a plain training loop in one process; (b) the executor at dp1; (c) a plain
``torch.distributed`` DDP script, 2 processes on gloo (NCCL on CUDA); (d) the executor at
dp2. Each reports the median step over the steps after ``WARMUP``; for the executor both
the ranks' own step and the step as the job sees it (plus the round trip to the ranks,
what its throughput is computed from). Prints one JSON object with the ratios and writes
it to ``bench/out/executor_overhead-<device>.json``. The task is gpt-char, batch 16,
AdamW at the task's learning rate, fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autotune.benchmarks import REPO
from autotune.core import JobConfig, Layout
from autotune.executor.runner import JobRunner, RunnerConfig
from autotune.executor.tasks import GPTChar
from autotune.ray_session import ensure_ray

WARMUP = 5
BATCH = 16


def _median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[WARMUP:])


def _loop(
    model: torch.nn.Module, task: GPTChar, batches: Any, steps: int, device: str
) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.learning_rate, weight_decay=0.0)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        inputs, targets = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(model, (inputs.to(device), targets.to(device)))
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def plain_loop(steps: int, threads: int, seed: int, device: str) -> float:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    task = GPTChar(batch_size=BATCH)
    model = task.build_model().to(device)
    return _median_after_warmup(_loop(model, task, task.batches(0, 1, seed), steps, device))


def _ddp_rank(
    rank: int, port: int, steps: int, threads: int, seed: int, device: str, out: str
) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(threads)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(seed)
        task = GPTChar(batch_size=BATCH)
        where = f"cuda:{rank}" if device == "cuda" else "cpu"
        model = DistributedDataParallel(task.build_model().to(where))
        times = _loop(model, task, task.batches(rank, 2, seed), steps, where.split(":")[0])
        if rank == 0:
            Path(out).write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()


def plain_ddp(steps: int, threads: int, seed: int, device: str) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
            _ddp_rank, args=(port, steps, threads, seed, device, out), nprocs=2, join=True
        )
        return _median_after_warmup(json.loads(Path(out).read_text()))


def executor(dp: int, steps: int, seed: int, device: str) -> dict[str, float]:
    run = RunnerConfig(
        task="gpt-char",
        steps=steps,
        batch_size=BATCH,
        seed=seed,
        device=device,
        checkpoint_every=steps,
    )
    result = JobRunner(run, JobConfig(layout=Layout(world_size=dp))).run()
    return {
        "rank_step_s": _median_after_warmup(result.step_times_s),
        "job_step_s": _median_after_warmup(result.wall_times_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--threads", type=int, default=1, help="threads per rank (the executor gives each rank 1)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.steps <= WARMUP + 5:
        parser.error(f"--steps must be > {WARMUP + 5}")
    plain = plain_loop(args.steps, args.threads, args.seed, args.device)
    ddp = plain_ddp(args.steps, args.threads, args.seed, args.device)
    started = ensure_ray(num_cpus=max(2, os.cpu_count() or 1))
    try:
        dp1 = executor(1, args.steps, args.seed, args.device)
        dp2 = executor(2, args.steps, args.seed, args.device)
    finally:
        if started:
            import ray

            ray.shutdown()
    report = {
        "task": "gpt-char",
        "batch": BATCH,
        "steps": args.steps,
        "warmup": WARMUP,
        "threads_per_rank": args.threads,
        "device": args.device,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "plain_loop_step_s": plain,
        "executor_dp1": dp1,
        "plain_ddp2_step_s": ddp,
        "executor_dp2": dp2,
        "ratio_dp1": dp1["job_step_s"] / plain,
        "ratio_dp2": dp2["job_step_s"] / ddp,
        "overhead_dp1_ms": 1000 * (dp1["job_step_s"] - plain),
    }
    out = REPO / "bench" / "out" / f"executor_overhead-{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
