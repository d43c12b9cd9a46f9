"""Does the performance model earn trust on real links? Calibrated from at most six
configurations measured on the testbed, it predicts the others.

    python bench/model_on_links.py bench/out/time_to_target.json
                                   [--calibrate ddp-fp32 topk-1% int8 powersgd-4 bf16 tp2]
                                   [--cluster-file CLUSTER_FILE] [--json FILE]

Reads what ``bench/time_to_target.py`` measured (per fixed configuration and seed: the
median step, the communication share, the steps to the target loss), takes the median
over the seeds, and:

1. fits the model's device and coefficients (``autotune.executor.calibrate.fit_profile``
   over ``LINK_FREE``: the CPU's fp32 peak and 16-bit speed, the per-step overhead, the
   link's latency and achieved bandwidth share, the overlap; and a tensor-parallel
   collective's latency where ``tp2`` is among them) to the ``--calibrate``
   configurations' step times and, where measured, their compute (the step less the
   synchronisation no rank hid), on the testbed's shape: one rank per machine, the link
   at its shaped rate;
2. predicts every other configuration's step time and communication share (the step
   time the synchronisation adds beyond compute, over the step: what the executor's
   ``sync_time_s`` measures), and its steps to the target: plain DDP's steps over the
   configuration's statistical efficiency (``autotune.perf.model``'s compression and
   precision efficiencies);
3. reports each error, the mean and the worst (goals: step time <= 10% mean and <= 20%
   worst held out, on every layout; steps to target within 20% under compression).

With ``--cluster-file`` (a cluster file ``autotune calibrate --cluster-file`` calibrated,
on the testbed the runs were made on) nothing is fitted: the model is the one the
daemon and ``autotune train-policy`` use on that cluster, its device, coefficients and
links as the file has them, the task's own compute where the calibration fitted it
(``autotune calibrate --compute TASK``), and the task's noise scale and compression
efficiencies as its calibration measured them (``autotune.catalog.tasks.task_profile``).
Every configuration the calibration did not itself measure of the task is held out: on
a task other than the calibration's (gpt-char), every one but plain DDP where its
compute was fitted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT
from autotune.benchmarks.time_to_target import REFERENCE, job_config

CALIBRATION = ("ddp-fp32", "topk-1%", "int8", "powersgd-4", "bf16", "tp2")
"""Six configurations: dense, three kinds of compression, 16-bit, tensor parallel."""


def _medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for row in runs:
        if "recipe" in row and "error" not in row:
            by.setdefault(row["config"], []).append(row)
    out = {}
    for label, rows in by.items():
        shares = [
            r["communication_share"] for r in rows if r.get("communication_share") is not None
        ]
        reached = [r["steps"] for r in rows if r.get("reached")]
        out[label] = {
            "recipe": rows[0]["recipe"],
            "step_s": statistics.median(r["step_time_s_median"] for r in rows),
            "communication_share": statistics.median(shares) if shares else None,
            "steps": statistics.median(reached) if len(reached) == len(rows) else None,
        }
    return out


def run(
    measured: dict[str, Any], calibrate: list[str], cluster_file: Path | None = None
) -> dict[str, Any]:
    from autotune.catalog.clusters import load_cluster
    from autotune.catalog.devices import device
    from autotune.catalog.tasks import BUILTIN_TASKS, task_profile
    from autotune.executor.calibrate import (
        LINK_FREE,
        TP_LATENCY,
        Measurement,
        fit_profile,
        link_free,
        step_of,
    )
    from autotune.perf.model import Shape, statistical_efficiency

    machines, mbit, batch = measured["machines"], measured["mbit"], measured["global_batch"]
    rows = _medians(measured["runs"])
    if cluster_file is None:
        profile = BUILTIN_TASKS[measured["task"]].profile
        gbps = mbit / 8 / 1000
    else:
        cluster = load_cluster(cluster_file)
        found = cluster.profile()
        if found is None or cluster.calibration is None:
            raise SystemExit(f"{cluster_file}: not calibrated (autotune calibrate --cluster-file)")
        if len(cluster.nodes) != machines:
            raise SystemExit(
                f"{cluster_file} has {len(cluster.nodes)} machines; the runs had {machines}"
            )
        spec, coeffs = found
        task = measured["task"]
        profile = task_profile(task)
        coeffs = cluster.task_coefficients.get(task, coeffs)
        gbps = min(n.inter_node_bandwidth_gbps for n in cluster.with_measured_links().nodes)
        # In sample: the calibration's own runs of this task at this batch, the link
        # grid's (gpt-char) or the task's compute runs (--compute).
        if cluster.calibration.get("task") == task:
            own = {c["config"] for c in cluster.calibration["configs"]}
        else:
            of_task = (cluster.calibration.get("statistics") or {}).get(task, {})
            own = {c["config"] for c in (of_task.get("compute") or {}).get("configs", [])}
        calibrate = [
            label
            for label, row in rows.items()
            if job_config(machines, row["recipe"]).describe() in own
        ]
    shape = Shape(gpu_model="CPU", ranks_per_node=(1,) * machines, inter_node_gbps=gbps)
    missing = [c for c in calibrate if c not in rows]
    if missing:
        raise SystemExit(f"not measured: {', '.join(missing)}")
    if len(calibrate) > 6:
        raise SystemExit("calibrate from at most 6 configurations")

    def measurement(label: str) -> Measurement:
        share = rows[label]["communication_share"]
        return Measurement(
            job_config(machines, rows[label]["recipe"]),
            rows[label]["step_s"],
            0,
            shape=shape,
            batch=batch,
            sync_s=None if share is None else share * rows[label]["step_s"],
        )

    if cluster_file is None:
        fitted = [measurement(c) for c in calibrate]
        spec, coeffs = fit_profile(profile, fitted, device("CPU"), link_free(fitted))
    ref = rows[REFERENCE]
    table = []
    for label, row in rows.items():
        m = measurement(label)
        step = step_of(profile, m, spec, coeffs)
        share = max(0.0, step.step_s - step.compute_s) / step.step_s
        efficiency = statistical_efficiency(profile, m.config, batch)
        steps = ref["steps"] / efficiency if ref["steps"] else None
        table.append(
            {
                "config": label,
                "held_out": label not in calibrate,
                "measured_step_s": round(row["step_s"], 4),
                "predicted_step_s": round(step.step_s, 4),
                "step_error": round(step.step_s / row["step_s"] - 1, 4),
                "measured_communication_share": row["communication_share"],
                "predicted_communication_share": round(share, 3),
                "measured_steps": row["steps"],
                "predicted_steps": None if steps is None else round(steps, 1),
                "steps_error": (
                    round(steps / row["steps"] - 1, 4) if steps and row["steps"] else None
                ),
            }
        )
    held = [abs(r["step_error"]) for r in table if r["held_out"]]
    compressed = [
        abs(r["steps_error"])
        for r in table
        if r["steps_error"] is not None and "compression" in rows[r["config"]]["recipe"]
    ]
    return {
        "task": measured["task"],
        "machines": machines,
        "mbit": mbit,
        "calibrated_from": calibrate,
        "cluster_file": None if cluster_file is None else str(cluster_file),
        "device": {"peak_tflops": dict(spec.peak_tflops)},
        "coefficients": {
            p.name: getattr(coeffs, p.name)
            for p in (*LINK_FREE, TP_LATENCY)
            if hasattr(coeffs, p.name)
        },
        "configs": table,
        "held_out_step_error_mean": round(statistics.fmean(held), 4) if held else None,
        "held_out_step_error_worst": round(max(held), 4) if held else None,
        "steps_error_compressed_worst": round(max(compressed), 4) if compressed else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("measured", type=Path, help="bench/time_to_target.py's JSON output")
    p.add_argument(
        "--calibrate",
        nargs="+",
        default=list(CALIBRATION),
        help="The configurations the model is fitted to (at most 6).",
    )
    p.add_argument(
        "--cluster-file",
        type=Path,
        help="Fit nothing: predict with this calibrated cluster file's model, as the "
        "daemon and autotune train-policy do.",
    )
    p.add_argument("--json", type=Path, default=OUT / "model_on_links.json")
    args = p.parse_args(argv)
    result = run(json.loads(args.measured.read_text()), args.calibrate, args.cluster_file)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    for r in result["configs"]:
        print(
            f"{r['config']:<18} {'held out' if r['held_out'] else 'fitted  '} "
            f"step {r['measured_step_s'] * 1e3:7.1f} ms, model {r['predicted_step_s'] * 1e3:7.1f}"
            f" ({r['step_error']:+.0%}); comm share {r['measured_communication_share']}"
            f" vs {r['predicted_communication_share']}; steps {r['measured_steps']}"
            f" vs {r['predicted_steps']}",
            file=sys.stderr,
        )
    print(json.dumps({k: v for k, v in result.items() if k != "configs"}, indent=1))
    return 0
