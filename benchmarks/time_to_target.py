"""Time to a target loss on the testbed: does what autotune chooses make a job reach its
loss sooner than plain data-parallel training?

    python bench/time_to_target.py [--machines 2] [--mbit 100] [--task gpt-char]
                                   [--n-steps 100] [--seeds 0 1 2] [--configs ...]
                                   [--policies rules learned] [--checkpoint DIR]
                                   [--calibration CLUSTER_FILE] [--json FILE]

On a testbed of ``--machines`` machines (``autotune.benchmarks.testbed``: network
namespaces, ``ray start`` on each, links shaped to ``--mbit`` Mbit/s each way, one CPU
each), with the driver on the head machine:

1. **The reference.** Plain DDP in fp32 over every machine (what a user runs without
   autotune) trains ``--n-steps`` steps. The **target** is its loss at step N: the mean
   of the last ``--window`` steps' losses.
2. **Each configuration** (``--configs``: each knob alone, the grid's combinations, top-k
   at 0.1%, 0.2% and 0.5%, and adaptive top-k from 1%) trains from the same seed until
   the mean of its last ``--window`` losses is at or below the target, or ``3 N`` steps
   (then it failed to reach it). Adaptive top-k's rows list the shares it moved to
   (``ratios``: step, share).
3. **Each policy served by the daemon** (``--policies``: ``rules``, ``learned``, the
   shipped learned policy as the daemon loads it by default): the job is submitted to
   the daemon on ``--backend ray`` (in this process: its tick, decision step, policy and
   Ray backend, ``--round-s`` between ticks) with every machine's GPU within its reach,
   and cancelled when it reaches the target. Its restarts (each reconfiguration)
   count in its time. The Ray backend knows the links as measured at the start
   (``autotune cluster describe``'s measurement), as a user's daemon given
   ``--cluster-file`` does; with ``--calibration``, also the device and links as
   ``autotune calibrate --cluster-file`` fitted them. ``--checkpoint`` serves a learned
   policy of one's own (``autotune train-policy --cluster-file``) instead of the shipped
   one.

Each run reports the wall time from its start (ranks started, or the job submitted) to
the step that reached the target, the steps, the bytes of gradients sent, the median step,
and the communication share of the step: the gradient synchronisation no rank hid
(``JobMetrics.sync_time_s``) over the step time. The **grid's best** (the oracle) is the
fastest of the fixed configurations run (adaptive top-k is not one). ``--seeds`` repeats
it all; the summary gives, per configuration, the median and the spread (min, max)
over the seeds, and its speed-up against plain DDP.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT
from autotune.benchmarks.testbed import Testbed
from autotune.serde import to_json

REFERENCE = "ddp-fp32"
"""Plain DDP in fp32 over every machine."""

KNOBS: dict[str, str] = {
    "topk-1%": "compression=topk:0.01",
    "topk-10%": "compression=topk:0.1",
    "int8": "compression=int8",
    "fp8": "compression=fp8",
    "powersgd-4": "compression=powersgd:4",
    "bf16": "precision=bf16",
    "tp2": "tp=2",
    "pp2": "pp=2 micro_batches=4",
}
"""Each knob alone, over plain DDP in fp32 on every machine."""

COMBINATIONS: dict[str, str] = {
    "powersgd-4+bf16": "compression=powersgd:4 precision=bf16",
    "topk-1%+bf16": "compression=topk:0.01 precision=bf16",
    "int8+bf16": "compression=int8 precision=bf16",
}
"""The grid's combinations of knobs, beside the knobs alone."""

TOPK_SHARES: dict[str, str] = {
    "topk-0.1%": "compression=topk:0.001",
    "topk-0.2%": "compression=topk:0.002",
    "topk-0.5%": "compression=topk:0.005",
    "topk-adaptive": "compression=topk:0.01 adaptive_topk=1",
}
"""Top-k's other kept shares, and adaptive top-k (``WorkerSpec.adaptive_topk``: from 1%,
the share moves with what the job measures). Adaptive top-k is not one of the grid's
fixed configurations: the grid's best is chosen without it."""


def job_config(machines: int, recipe: str) -> Any:
    """The ``JobConfig`` of a recipe (``key=value`` words: ``compression``, ``precision``,
    ``tp``, ``pp``, ``micro_batches``) over ``machines`` ranks, data parallel over what
    tensor and pipeline parallelism leave."""
    from autotune.cli.common import parse_compression
    from autotune.cli.executor import parse_precision
    from autotune.core import JobConfig, Layout

    words = dict(w.split("=", 1) for w in recipe.split())
    words.pop("adaptive_topk", None)  # how the executor runs it, not the config
    tp, pp = int(words.get("tp", 1)), int(words.get("pp", 1))
    if machines % (tp * pp):
        raise ValueError(f"{recipe!r}: tp x pp must divide the {machines} machines")
    return JobConfig(
        layout=Layout(
            world_size=machines,
            dp=machines // (tp * pp),
            tp=tp,
            pp=pp,
            micro_batches=int(words.get("micro_batches", 1)),
        ),
        precision=parse_precision(words.get("precision", "fp32")),
        compression=parse_compression(words.get("compression", "none")),
    )


@dataclass
class Curve:
    """A run's steps as they happened: the loss of each step and when it was recorded
    (steps redone after a restart overwrite their first record)."""

    started: float
    window: int
    losses: dict[int, float]
    at: dict[int, float]

    def add(self, step: int, loss: float | None, when: float) -> None:
        if loss is not None:
            self.losses[step] = loss
            self.at[step] = when

    def smoothed(self, step: int) -> float | None:
        """The mean loss of the ``window`` steps up to ``step``, once all are known."""
        span = [self.losses.get(s) for s in range(step - self.window + 1, step + 1)]
        if step < self.window or any(x is None for x in span):
            return None
        return statistics.fmean(x for x in span if x is not None)

    def reached(self, target: float) -> int | None:
        """The first step whose smoothed loss is at or below ``target``."""
        for step in sorted(self.losses):
            value = self.smoothed(step)
            if value is not None and value <= target:
                return step
        return None


def _summary(
    label: str, curve: Curve, target: float | None, limit: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """A run's row; ``target=None``: the reference's, whose target is its own smoothed
    loss at its last step."""
    last = max(curve.losses, default=0)
    if target is None:
        target = curve.smoothed(last)
    step = curve.reached(target) if target is not None else None
    return {
        "config": label,
        "target": target,
        "reached": step is not None,
        "steps": step if step is not None else last,
        "step_limit": limit,
        "time_to_target_s": round(curve.at[step] - curve.started, 2) if step else None,
        "loss_smoothed": curve.smoothed(step if step else last),
        **extra,
    }


def run_fixed(
    address: str,
    task: str,
    machines: int,
    label: str,
    recipe: str,
    *,
    seed: int,
    batch: int | None,
    target: float | None,
    limit: int,
    window: int,
) -> dict[str, Any]:
    """Train one fixed configuration until the target (or ``limit`` steps)."""
    from autotune.executor.runner import JobRunner, RunnerConfig

    config = job_config(machines, recipe)
    curve = Curve(time.time(), window, {}, {})

    def on_step(runner: Any, step: int, metrics: Any) -> None:
        curve.add(step, metrics.loss, time.time())
        value = curve.smoothed(step)
        if target is not None and value is not None and value <= target:
            runner.stop()

    adaptive = "adaptive_topk=1" in recipe.split()
    run = RunnerConfig(
        task=task,
        steps=limit,
        batch_size=batch,
        seed=seed,
        device="cpu",
        adaptive_topk=adaptive,
    )
    runner = JobRunner(run, config, on_step=on_step)
    curve.started = time.time()
    result = runner.run().summary()
    nodes = {p["node"] for p in result["placement"]}
    if len(nodes) != machines:
        raise RuntimeError(f"{label}: ranks on {len(nodes)} of {machines} machines")
    return _summary(
        label,
        curve,
        target,
        limit,
        {
            "recipe": recipe,
            "bytes_sent": result["bytes_sent"],
            "bytes_dense": result["bytes_dense"],
            "step_time_s_median": round(result["step_time_s_median"], 4),
            "sync_time_s_median": _round(result["sync_time_s_median"]),
            "communication_share": _round(result["communication_share"]),
            "compression_cosine": _round(result["compression_cosine"]),
            **(
                {
                    "adaptive": True,
                    "ratios": [
                        [e["step"], e["to"]]
                        for e in result["events"]
                        if e["kind"] == "compression_ratio" and "to" in e
                    ],
                }
                if adaptive
                else {}
            ),
        },
    )


def run_served(
    address: str,
    task: str,
    machines: int,
    policy_name: str,
    *,
    seed: int,
    batch: int,
    target: float,
    limit: int,
    window: int,
    round_s: float,
    root: Path,
    cluster: Any = None,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Submit the job to the daemon serving ``policy_name`` (on the Ray backend told the
    ``cluster``'s measured links) and follow it to the target. ``checkpoint``: the
    learned policy's (default: the shipped one)."""
    from autotune.benchmarks.recovery import DaemonHarness
    from autotune.policies.rules import RulesPolicy
    from autotune.policies.serving import LearnedPolicy

    policy: Any = (
        RulesPolicy() if policy_name == "rules" else LearnedPolicy(checkpoint, round_s=round_s)
    )
    harness = DaemonHarness(
        address, root, checkpoint_every=25, tick_s=round_s, policy=policy, cluster=cluster
    )
    job = f"{task}-{policy_name}-s{seed}"
    curve = Curve(time.time(), window, {}, {})
    done: dict[str, Any] = {}
    try:
        harness.submit(
            job, min_gpus=machines, max_gpus=machines, steps=limit, task=task, global_batch=batch
        )
        curve.started = time.time()

        def finished() -> bool:
            for when, step, loss in harness.steps_of(job):
                curve.add(step, loss, when)
            if curve.reached(target) is not None:
                return True
            record = harness.job(job)
            return record["state"] in ("finished", "failed", "cancelled")

        harness.tick_until(job, finished, timeout_s=limit * 5 + 300, during=lambda: None)
        harness.cancel(job)
        decisions = harness.decisions(job)
        done = {
            "policy_version": policy.version,
            "decisions": len(decisions),
            "configs": [_describe(d["config"]) for d in reversed(decisions)],
        }
    finally:
        harness.close()
    return _summary(f"{policy_name} (daemon)", curve, target, limit, done)


def describe_cluster(address: str) -> Any:
    """The Ray cluster's description with its links measured, as
    ``autotune cluster describe`` writes it (Ray connected)."""
    from autotune.catalog.clusters import ClusterDescription
    from autotune.executor.cluster import ray_cluster
    from autotune.executor.links import measure_links

    nodes = ray_cluster().alive
    return ClusterDescription(
        nodes=tuple(nodes), links=tuple(measure_links(nodes)), source=f"ray://{address}"
    ).with_measured_links()


def _calibration(path: Path | None) -> dict[str, Any] | None:
    """The calibration saved in a cluster file (``autotune calibrate --cluster-file``)."""
    if path is None:
        return None
    from autotune.catalog.clusters import load_cluster
    from autotune.errors import InputError

    try:
        found = load_cluster(path).calibration
    except InputError as exc:
        raise SystemExit(f"--calibration {path}: {exc}") from None
    if found is None:
        raise SystemExit(
            f"--calibration {path}: the cluster file holds no calibration "
            "(autotune calibrate --cluster-file)"
        )
    return dict(found)


def _describe(config: dict[str, Any]) -> str:
    layout, compression = config["layout"], config["compression"]
    precision = sorted({v for v in config["precision"].values() if isinstance(v, str)})
    return (
        f"dp{layout['dp']} tp{layout['tp']} pp{layout['pp']} "
        f"{compression['kind']}{'' if compression.get('ratio') is None else compression['ratio']}"
        f"{'' if compression.get('rank') is None else compression['rank']} {'/'.join(precision)}"
        f"{'' if config.get('global_batch') is None else ' batch ' + str(config['global_batch'])}"
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def run(
    args: argparse.Namespace,
    progress: Callable[[str], None] = print,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The whole benchmark; ``save(result)`` after every run (the runs so far), so that a
    long benchmark stopped half-way keeps what it measured."""
    from autotune.catalog.tasks import BUILTIN_TASKS

    if args.task not in BUILTIN_TASKS:
        raise SystemExit(f"--task {args.task!r}: not a built-in task")
    batch = args.batch or BUILTIN_TASKS[args.task].profile.reference_batch
    calibration = _calibration(args.calibration)
    recipes = {REFERENCE: "", **KNOBS, **COMBINATIONS, **TOPK_SHARES}
    chosen = {k: v for k, v in recipes.items() if args.configs is None or k in args.configs}
    result: dict[str, Any] = {
        "task": args.task,
        "machines": args.machines,
        "mbit": args.mbit,
        "n_steps": args.n_steps,
        "window": args.window,
        "global_batch": batch,
        "seeds": args.seeds,
        "runs": [],
    }
    # Everything the runs import, imported before the first run: a long benchmark does
    # not pick up half of a source tree edited meanwhile.
    import autotune.benchmarks.recovery
    import autotune.executor.runner
    import autotune.policies.rules
    import autotune.policies.serving  # noqa: F401

    bed = Testbed(args.machines, mbit=args.mbit, cpus=1)
    try:
        with bed.driver("head"):
            from autotune.policies.serving import LearnedPolicy

            if args.checkpoint is not None and "learned" in args.policies:
                # Loaded once Ray is connected (loading reads Ray's settings, its token
                # authentication among them).
                refused = LearnedPolicy(args.checkpoint).fallback_reason
                if refused is not None:  # the daemon would serve rules in its place
                    raise SystemExit(f"--checkpoint {args.checkpoint}: {refused}")
            # As a user describes the cluster before the daemon serves it: its nodes and
            # measured links (``autotune cluster describe``).
            cluster = describe_cluster(bed.ray_address)
            result["links"] = [to_json(link) for link in cluster.links]
            if calibration is not None:
                # The device and links as ``autotune calibrate --cluster-file`` fitted
                # them on a cluster of these machines.
                cluster = cluster.with_calibration(calibration)
                result["calibration"] = calibration
            for seed in args.seeds:
                common = {"seed": seed, "batch": batch, "window": args.window}
                ref = run_fixed(
                    bed.ray_address, args.task, args.machines, REFERENCE, "",
                    target=None, limit=args.n_steps, **common,
                )  # fmt: skip
                target = ref["target"]
                progress(f"seed {seed}: target {target:.4f}; {_line(ref)}")
                result["runs"].append({"seed": seed, **ref})
                for label, recipe in chosen.items():
                    if label == REFERENCE:
                        continue
                    try:
                        row = run_fixed(
                            bed.ray_address, args.task, args.machines, label, recipe,
                            target=target, limit=3 * args.n_steps, **common,
                        )  # fmt: skip
                    except Exception as exc:  # a configuration this job cannot train
                        row = {"config": label, "recipe": recipe, "error": str(exc)[-500:]}
                    progress(f"seed {seed}: {_line(row)}")
                    result["runs"].append({"seed": seed, **row})
                    if save is not None:
                        save(result)
                for name in args.policies:
                    try:
                        with tempfile.TemporaryDirectory(dir=bed.root) as tmp:
                            row = run_served(
                                bed.ray_address, args.task, args.machines, name,
                                target=target, limit=3 * args.n_steps, round_s=args.round_s,
                                root=Path(tmp), cluster=cluster, checkpoint=args.checkpoint,
                                **common,
                            )  # fmt: skip
                    except Exception as exc:  # reported, and the benchmark goes on
                        row = {"config": f"{name} (daemon)", "error": repr(exc)[-500:]}
                    progress(f"seed {seed}: {_line(row)}")
                    result["runs"].append({"seed": seed, **row})
                    if save is not None:
                        save(result)
    finally:
        bed.close()
    result["summary"] = summarise(result["runs"])
    return result


def _line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['config']}: error {row['error'][-200:]}"
    when = row["time_to_target_s"]
    return (
        f"{row['config']}: "
        + (f"target in {when:.1f} s, {row['steps']} steps" if row["reached"] else "not reached")
        + (
            f", comm share {row['communication_share']:.2f}"
            if row.get("communication_share") is not None
            else ""
        )
    )


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration over the seeds: the median time to target (a run that missed
    it counts as never), its spread, and the speed-up against plain DDP; the grid's
    best per seed (the fastest fixed configuration: not adaptive top-k)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for row in runs:
        by.setdefault(row["config"], []).append(row)
    reference = {r["seed"]: r["time_to_target_s"] for r in by.get(REFERENCE, [])}
    best: dict[int, tuple[float, str]] = {}
    for row in runs:
        t = row.get("time_to_target_s")
        if (
            t is not None
            and "recipe" in row
            and not row.get("adaptive")
            and (row["seed"] not in best or t < best[row["seed"]][0])
        ):
            best[row["seed"]] = (t, row["config"])
    out: dict[str, Any] = {}
    for label, rows in by.items():
        times = [r.get("time_to_target_s") for r in rows]
        reached = [t for t in times if t is not None]
        speedups = [
            reference[r["seed"]] / r["time_to_target_s"]
            for r in rows
            if r.get("time_to_target_s") and reference.get(r["seed"])
        ]
        of_best = [
            best[r["seed"]][0] / r["time_to_target_s"]
            for r in rows
            if r.get("time_to_target_s") and r["seed"] in best
        ]
        shares = [
            r["communication_share"] for r in rows if r.get("communication_share") is not None
        ]
        out[label] = {
            "runs": len(rows),
            "reached": len(reached),
            "time_to_target_s_median": statistics.median(reached)
            if len(reached) == len(rows)
            else None,
            "time_to_target_s_range": [min(reached), max(reached)] if reached else None,
            "speedup_vs_ddp_median": round(statistics.median(speedups), 3) if speedups else None,
            "of_grid_best_median": round(statistics.median(of_best), 3) if of_best else None,
            "communication_share_median": round(statistics.median(shares), 3) if shares else None,
        }
    out["grid_best"] = {str(seed): label for seed, (_t, label) in best.items()}
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    every = [REFERENCE, *KNOBS, *COMBINATIONS, *TOPK_SHARES]
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--machines", type=int, default=2, choices=[2, 3, 4])
    p.add_argument("--mbit", type=float, default=100.0, help="Link rate each way, Mbit/s.")
    p.add_argument("--task", default="gpt-char", help="The job's task (a built-in name).")
    p.add_argument("--batch", type=int, default=None, help="Global batch (default: the task's).")
    p.add_argument(
        "--n-steps", type=int, default=100, help="N: the target is plain DDP's loss at step N."
    )
    p.add_argument("--window", type=int, default=10, help="Steps the loss is averaged over.")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--configs",
        nargs="*",
        default=None,
        choices=every,
        help="Fixed configurations (default: all).",
    )
    p.add_argument(
        "--policies", nargs="*", default=["rules", "learned"], choices=["rules", "learned"],
        help="Policies served by the daemon.",
    )  # fmt: skip
    p.add_argument("--round-s", type=float, default=2.0, help="The daemon's tick, seconds.")
    p.add_argument(
        "--checkpoint", type=Path, default=None,
        help="The learned policy's checkpoint (default: the shipped policy), e.g. one "
        "trained by autotune train-policy --cluster-file.",
    )  # fmt: skip
    p.add_argument(
        "--calibration", type=Path, default=None,
        help="A cluster file calibrated by autotune calibrate --cluster-file: the daemon's "
        "Ray backend is told its device and links (default: the links as measured).",
    )  # fmt: skip
    p.add_argument("--json", type=Path, default=OUT / "time_to_target.json")
    args = p.parse_args(argv)
    if args.n_steps < args.window:
        p.error(f"--n-steps {args.n_steps}: at least --window ({args.window})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    about = {
        "date": datetime.now(UTC).date().isoformat(),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "command": " ".join(["python", "bench/time_to_target.py", *(argv or sys.argv[1:])]),
    }

    def save(result: dict[str, Any]) -> None:
        args.json.write_text(json.dumps({**about, **result}, indent=1) + "\n")

    result = run(args, progress=lambda line: print(line, file=sys.stderr, flush=True), save=save)
    save(result)
    print(json.dumps(result["summary"], indent=1))
    return 0
