"""Uneven batch shares on machines of different speeds: does giving a slow machine's
rank fewer samples make a data-parallel job faster, with the same loss per sample?

    python bench/hetero_shares.py [--speeds 1 0.5] [--mbit 1000] [--tasks gpt-char ...]
                                  [--layout dp|pp] [--steps 60] [--seeds 0 1 2] [--json FILE]

On a testbed of one machine per ``--speeds`` entry (``autotune.benchmarks.testbed``:
network namespaces, ``ray start`` on each, links shaped to ``--mbit`` Mbit/s each way),
each machine's processes capped at that many CPUs of the host (a cgroup CPU quota: 0.5
is a device of half the speed), one rank of a data-parallel job per machine, rank ``i``
on machine ``i``, trains each task for ``--steps`` steps three ways:

- ``even``: the global batch split evenly (what data parallelism does today);
- ``by-speed``: split in the proportions of ``--speeds`` (``--batch-shares``: the
  shares a user or the Planner would give from the devices' known speeds);
- ``balanced``: from even, moved to the ranks' measured speeds while it trains
  (``--balance-batch``, ``autotune.executor.balance``).

With ``--layout pp`` the job is a pipeline instead, one stage per machine (stage ``i``
on machine ``i``, ``--micro-batches`` micro-batches a step), trained two ways: ``even``
(the block stack cut evenly, as pipeline parallelism does today) and ``by-speed`` (cut
in the proportions of ``--speeds``: ``--stage-weights``). Its losses are the same math
either way.

Each run reports its throughput (samples/s from the end of step ``--warmup`` to the last
step, and over the last half of the steps: after ``balanced`` found its shares), the
median step, the shares it ended on and, for ``balanced``, when it moved. The
loss per sample is the same by construction (gradients averaged by samples, the same
global batch): each run's losses are compared step by step with ``even``'s of the same
seed, beside the spread of ``even``'s final loss over the seeds (the noise). The summary
gives per task and arm the median throughput over the seeds and its ratio to ``even``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT
from autotune.benchmarks.testbed import Testbed

ARMS = ("even", "by-speed", "balanced")


def _placement(bed: Testbed, job_id: str) -> Any:
    """Rank ``i`` on machine ``i`` (by the address its raylet registered with)."""
    import ray

    from autotune.core import Placement, RankSlot
    from autotune.executor.cluster import node_name

    by_address = {
        e["NodeManagerAddress"]: str(e["NodeID"])
        for e in ray.nodes()  # type: ignore[no-untyped-call]
        if e.get("Alive")
    }
    slots = []
    for m in bed.machines:
        if m.address not in by_address:
            raise RuntimeError(f"machine {m.name} ({m.address}) is not in the Ray cluster")
        slots.append(RankSlot(rank=m.index, node_id=node_name(by_address[m.address]), gpu_index=0))
    return Placement(job_id=job_id, ranks=tuple(slots))


def run_arm(
    bed: Testbed,
    task: str,
    arm: str,
    *,
    speeds: list[float],
    steps: int,
    seed: int,
    batch: int | None,
    warmup: int,
    layout: str = "dp",
    micro_batches: int = 4,
) -> dict[str, Any]:
    """Train ``task`` ``steps`` steps with the ``arm``'s batch shares (``layout`` dp) or
    stage cuts (pp)."""
    from autotune.core import JobConfig, Layout
    from autotune.executor.runner import JobRunner, RunnerConfig

    weights = tuple(speeds) if arm == "by-speed" else None
    pipeline = layout == "pp"
    run = RunnerConfig(
        task=task,
        steps=steps,
        batch_size=batch,
        seed=seed,
        device="cpu",
        batch_shares=None if pipeline else weights,
        stage_weights=weights if pipeline else None,
        balance_batch=arm == "balanced",
    )
    n = len(speeds)
    config = (
        JobConfig(layout=Layout(world_size=n, dp=1, pp=n, micro_batches=micro_batches))
        if pipeline
        else JobConfig.data_parallel(n)
    )
    runner = JobRunner(run, config, placement=_placement(bed, f"{arm}-{seed}"))
    began = time.time()
    result = runner.run()
    wall = time.time() - began
    walls = result.wall_times_s[warmup:]
    samples = result.samples[warmup:]
    moves = [e for e in result.events if e["kind"] == "batch_shares"]
    shares = moves[-1]["to"] if moves else None
    if arm == "by-speed" and not pipeline:
        from autotune.executor.tasks import split_batch

        shares = list(split_batch(result.samples[0], speeds))
    return {
        "task": task,
        "layout": layout,
        "arm": arm,
        "seed": seed,
        "steps": result.steps,
        "samples_per_s": round(sum(samples) / sum(walls), 3),
        "samples_per_s_last_half": round(
            sum(result.samples[steps // 2 :]) / sum(result.wall_times_s[steps // 2 :]), 3
        ),
        "step_s_median": round(statistics.median(walls), 4),
        "wall_s": round(wall, 2),
        "shares": shares,
        "stage_weights": list(weights) if pipeline and weights else None,
        "moves": [{k: e[k] for k in ("step", "from", "to", "seconds_per_sample")} for e in moves],
        "losses": [round(x, 5) for x in result.losses],
        "placement": result.placement,
    }


def summarise(runs: list[dict[str, Any]], window: int) -> dict[str, Any]:
    """Per task and arm: median throughput over the seeds, its ratio to ``even``'s, and
    how far the losses are from ``even``'s of the same seed."""
    out: dict[str, Any] = {}
    for task in sorted({r["task"] for r in runs}):
        rows = [r for r in runs if r["task"] == task]
        even = {r["seed"]: r for r in rows if r["arm"] == "even"}
        finals = [statistics.fmean(r["losses"][-window:]) for r in even.values()]
        per_task: dict[str, Any] = {
            "even_final_loss_spread_over_seeds": (
                round(max(finals) - min(finals), 5) if len(finals) > 1 else None
            )
        }
        for arm in ARMS:
            mine = [r for r in rows if r["arm"] == arm]
            if not mine:
                continue
            rates = [r["samples_per_s"] for r in mine]
            ratios = [
                r["samples_per_s"] / even[r["seed"]]["samples_per_s"]
                for r in mine
                if r["seed"] in even
            ]
            gaps = [
                max(
                    abs(a - b) for a, b in zip(r["losses"], even[r["seed"]]["losses"], strict=False)
                )
                for r in mine
                if r["seed"] in even
            ]
            final_gaps = [
                statistics.fmean(r["losses"][-window:])
                - statistics.fmean(even[r["seed"]]["losses"][-window:])
                for r in mine
                if r["seed"] in even
            ]
            halves = [
                r["samples_per_s_last_half"] / even[r["seed"]]["samples_per_s_last_half"]
                for r in mine
                if r["seed"] in even
            ]
            per_task[arm] = {
                "samples_per_s_median": round(statistics.median(rates), 3),
                "last_half_vs_even_median": round(statistics.median(halves), 3) if halves else None,
                "samples_per_s_range": [min(rates), max(rates)],
                "vs_even_median": round(statistics.median(ratios), 3) if ratios else None,
                "vs_even_per_seed": [round(x, 3) for x in ratios],
                "max_loss_gap_to_even": round(max(gaps), 5) if gaps else None,
                "final_loss_gap_to_even": [round(x, 5) for x in final_gaps],
                "shares": [r["shares"] for r in mine],
            }
        out[task] = per_task
    return out


def run(
    args: argparse.Namespace,
    progress: Callable[[str], None] = print,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "speeds": args.speeds,
        "mbit": args.mbit,
        "steps": args.steps,
        "warmup": args.warmup,
        "seeds": args.seeds,
        "tasks": args.tasks,
        "layout": args.layout,
        "micro_batches": args.micro_batches if args.layout == "pp" else None,
        "runs": [],
    }
    import autotune.executor.runner  # noqa: F401  (imported before the first run)

    bed = Testbed(len(args.speeds), mbit=args.mbit, cpus=1)
    try:
        for machine, speed in zip(bed.machines, args.speeds, strict=False):
            bed.slow(machine, speed)
        with bed.driver("head"):
            for seed in args.seeds:
                for task in args.tasks:
                    for arm in args.arms:
                        row = run_arm(
                            bed, task, arm, speeds=args.speeds, steps=args.steps, seed=seed,
                            batch=args.batch, warmup=args.warmup, layout=args.layout,
                            micro_batches=args.micro_batches,
                        )  # fmt: skip
                        progress(
                            f"seed {seed} {task} {arm}: {row['samples_per_s']:.1f} samples/s, "
                            f"median step {row['step_s_median'] * 1000:.0f} ms, "
                            + (
                                f"stages {row['stage_weights'] or 'even'}"
                                if args.layout == "pp"
                                else f"shares {row['shares'] or 'even'}"
                            )
                            + f", loss {row['losses'][-1]:.4f}"
                        )
                        result["runs"].append(row)
                        if save is not None:
                            save(result)
    finally:
        bed.close()
    result["summary"] = summarise(result["runs"], args.window)
    return result


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--speeds", type=float, nargs="+", default=[1.0, 0.5],
        help="CPUs of the host each machine may use (its speed); one rank per machine",
    )  # fmt: skip
    parser.add_argument("--mbit", type=float, default=1000.0, help="link bandwidth, Mbit/s")
    parser.add_argument("--tasks", nargs="+", default=["gpt-char", "mlp-synthetic"])
    parser.add_argument(
        "--layout", choices=("dp", "pp"), default="dp",
        help="dp: one data-parallel rank per machine; pp: one pipeline stage per machine",
    )  # fmt: skip
    parser.add_argument(
        "--micro-batches", type=int, default=4, help="micro-batches a step (--layout pp)"
    )
    parser.add_argument("--arms", nargs="+", default=None, choices=ARMS)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="steps not counted in the rate")
    parser.add_argument("--window", type=int, default=10, help="steps of the final loss")
    parser.add_argument("--batch", type=int, default=None, help="global batch (task's default)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", type=Path, default=OUT / "hetero_shares.json")
    args = parser.parse_args(argv)
    if not 2 <= len(args.speeds) <= 4 or min(args.speeds) <= 0:
        parser.error("--speeds: 2 to 4 positive CPU shares, one per machine")
    if args.steps <= args.warmup + 1:
        parser.error("--steps must exceed --warmup by 2 or more")
    if args.arms is None:
        args.arms = list(ARMS) if args.layout == "dp" else ["even", "by-speed"]
    if args.layout == "pp" and "balanced" in args.arms:
        parser.error("--arms balanced moves batch shares: data parallelism only (--layout dp)")
    if args.layout == "pp" and args.micro_batches < 1:
        parser.error("--micro-batches must be 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def save(result: dict[str, Any]) -> None:
        stamped = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "command": " ".join(["python bench/hetero_shares.py", *(argv or sys.argv[1:])]),
            **result,
        }
        args.json.write_text(json.dumps(stamped, indent=1) + "\n")

    result = run(args, save=save)
    save(result)
    print(json.dumps(result["summary"], indent=1))
    return 0
