"""A policy for one's own cluster, as a user makes it, on the testbed: describe the
cluster, calibrate the performance model on it, train a policy in its simulation.

    python bench/cluster_policy.py [--machines 2] [--mbit 100] [--steps 60] [--efficiency]
                                   [--task gpt-char:2 --task mlp-synthetic:2]
                                   [--window 2] [--round-s 2] [--iterations 10]
                                   [--out bench/out/cluster_policy]

On a testbed of ``--machines`` machines (``autotune.benchmarks.testbed``: one CPU each,
links shaped to ``--mbit`` Mbit/s), it runs the user's commands on the head machine, as
``autotune`` installed there:

1. ``autotune cluster describe --ray-address HEAD`` (the nodes, the links measured);
2. ``autotune calibrate --cluster-file`` (gpt-char over the machines under 6
   configurations, a tensor-parallel pair among them; the device and links fitted,
   saved into the file), with
   ``--compute TASK`` for each other task the users train (plain DDP at its batch and
   at 4x: the task's own speed, per-step overhead and per-collective cost);
3. with ``--efficiency``, ``autotune calibrate --cluster-file ... --efficiency TASK``
   for each task the users train (off the testbed: steps to a loss under each
   compression need no cluster);
4. ``autotune train-policy --cluster-file ... --task ...`` (off the testbed: training
   needs no cluster), unless ``--iterations 0``.

It writes ``OUT/cluster.json`` (the calibrated cluster file), ``OUT/policy/`` (the
checkpoint) and ``OUT/cluster_policy.json``: each command's wall time, the calibration's
fitted device and coefficients and its step-time errors (in sample and held out, per
configuration), and the training report. ``bench/time_to_target.py --calibration
OUT/cluster.json --checkpoint OUT/policy/final`` then serves the policy on a testbed of
the same shape.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT
from autotune.benchmarks.testbed import Testbed
from autotune.executor.calibrate import CLUSTER_STEPS


def _json_of(done: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{what} printed no JSON:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def _names(tasks: list[str]) -> list[str]:
    """The task names of ``--task NAME:GPUS`` options, once each."""
    return list(dict.fromkeys(t.partition(":")[0] for t in tasks))


def run(args: argparse.Namespace) -> dict[str, Any]:
    exe = str(Path(sys.executable).with_name("autotune"))
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = (args.out / "cluster.json").resolve()
    result: dict[str, Any] = {"machines": args.machines, "mbit": args.mbit}
    with Testbed(args.machines, mbit=args.mbit, cpus=1) as bed:
        address = bed.ray_address
        started = time.monotonic()
        described = bed.call(
            "head",
            [exe, "cluster", "describe", "--ray-address", address, "--out", str(cluster), "--json"],
            timeout=600,
        )
        result["describe"] = {
            "wall_s": round(time.monotonic() - started, 1),
            "links": _json_of(described, "autotune cluster describe")["links"],
        }
        started = time.monotonic()
        calibrated = bed.call(
            "head",
            [exe, "calibrate", "--cluster-file", str(cluster), "--ray-address", address,
             *(x for t in _names(args.task) for x in ("--compute", t)),
             "--steps", str(args.steps), "--seed", str(args.seed), "--json"],
            timeout=3600,
        )  # fmt: skip
        report = _json_of(calibrated, "autotune calibrate --cluster-file")
        result["calibrate"] = {"wall_s": round(time.monotonic() - started, 1), **report}
    if args.efficiency:
        started = time.monotonic()
        names = _names(args.task)
        measured = subprocess.run(
            [exe, "calibrate", "--cluster-file", str(cluster),
             *(x for t in names for x in ("--efficiency", t)),
             "--seed", str(args.seed), "--json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        statistics = _json_of(measured, "autotune calibrate --efficiency")["statistics"]
        result["efficiency"] = {
            "wall_s": round(time.monotonic() - started, 1),
            **{t: statistics[t]["compression_efficiency"] for t in names},
        }
    if args.iterations > 0:
        started = time.monotonic()
        trained = subprocess.run(
            [exe, "train-policy", "--cluster-file", str(cluster),
             *(x for t in args.task for x in ("--task", t)),
             "--window", str(args.window), "--round-s", str(args.round_s),
             "--iterations", str(args.iterations), "--seed", str(args.seed),
             "--out", str((args.out / "policy").resolve()), "--json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        training = _json_of(trained, "autotune train-policy --cluster-file")
        result["train_policy"] = {
            "wall_s": round(time.monotonic() - started, 1),
            "checkpoint": training.get("checkpoint"),
            "warm_start": training.get("warm_start"),
            "history": training.get("history"),
        }
    return result


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--machines", type=int, default=2, choices=[2, 3, 4])
    p.add_argument("--mbit", type=float, default=100.0, help="Link rate each way, Mbit/s.")
    p.add_argument(
        "--steps", type=int, default=CLUSTER_STEPS, help="Measured steps per configuration."
    )
    p.add_argument(
        "--task", action="append", default=None,
        help="A task the cluster's users train (train-policy's --task); repeat it. "
        "Default: gpt-char and mlp-synthetic on every machine.",
    )  # fmt: skip
    p.add_argument(
        "--efficiency", action="store_true",
        help="Also measure each task's efficiency under each compression (calibrate "
        "--efficiency) before training.",
    )  # fmt: skip
    p.add_argument("--window", type=int, default=2, help="Jobs per training episode.")
    p.add_argument("--round-s", type=float, default=2.0, help="The decision round, seconds.")
    p.add_argument("--iterations", type=int, default=10, help="PPO iterations (0: no training).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=OUT / "cluster_policy")
    args = p.parse_args(argv)
    if args.task is None:
        args.task = [f"gpt-char:{args.machines}", f"mlp-synthetic:{args.machines}"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "command": " ".join(["python", "bench/cluster_policy.py", *(argv or sys.argv[1:])]),
        **run(args),
    }
    (args.out / "cluster_policy.json").write_text(json.dumps(result, indent=1) + "\n")
    calibration = result["calibrate"]
    print(
        json.dumps(
            {
                "cluster_file": str(args.out / "cluster.json"),
                "checkpoint": result.get("train_policy", {}).get("checkpoint"),
                "mape_step_time": calibration.get("mape_step_time"),
                "mape_step_time_held_out": calibration.get("mape_step_time_held_out"),
                "wall_s": {
                    k: result[k]["wall_s"]
                    for k in ("describe", "calibrate", "efficiency", "train_policy")
                    if k in result
                },
            },
            indent=1,
        )
    )
    return 0
