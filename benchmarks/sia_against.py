"""autotune's policies against Sia, each in Sia's world, job by job.

Sia's JCTs come from Sia's own simulator run here (its ``--output`` log: one JSON record
per round, the last one holding every job's submission and completion time), e.g.::

    cd sia-simulator && python multi_simulator.py workloads/saturn/workload-1.csv \\
        --policy=sia --policy_p_val=-0.5 --mip_lambda_a=0.01 --mip_lambda_n=1.1 \\
        --interval=60 --project_throughputs --share_max_replicas \\
        --output=RUNS/workload-1.log

(its ``run_experiment.sh`` settings; its hard-coded CBC solver replaced by HiGHS where
cylp is missing, see ``bench/RESULTS.md``). Ours play the same workloads in the
Sia-compatible world (``autotune.studies.sia``): ``goodput`` (elastic jobs, the
heterogeneity-aware goodput optimiser) and ``fifo`` (rigid jobs on their asked GPUs).
For each, the average JCT beside Sia's, and the per-job paired difference (ours - Sia)
as a share of Sia's average JCT with its 95% bootstrap interval, per workload and
pooled::

    python bench/sia_against.py --sia /path/to/sia-simulator --sia-runs RUNS \\
        [--workloads saturn/workload-1.csv ...] [--json-out bench/out/sia_against.json]

Workloads without a log in ``--sia-runs`` are left out.

``--mix`` adds ``goodput-mixed``: the same optimiser in the same world, except that a
data-parallel job may also run across two GPU types (``sia_env``'s ``mix``: what Sia
never does), with its per-job paired difference against ``goodput`` (one type per job)
beside the one against Sia, and the share of busy GPU-rounds held by jobs across types.
It also checks the assumption the mixed step is built on (``SiaApp.mixed_step``: a
rank computes as it does alone on one GPU, and the sync comes on top): on every
multi-GPU row of every type's placement traces, one GPU's compute time at the row's
local batch plus the row's sync time against the row's traced step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from autotune.studies.pollux.protocol import paired_difference, pooled_difference
from autotune.studies.sia.fidelity import POLICIES, SATURN, play, sia_jcts
from autotune.studies.sia.trace import load_sia_apps

MIXED = "goodput-mixed"


def split_errors(sia: Path) -> dict[str, float]:
    """|one GPU's compute + traced sync - traced step| / traced step over every
    multi-GPU row of every type's placement traces within the one-GPU traced batches:
    the median, 90th percentile and the number of rows."""
    errors = [
        e
        for app in load_sia_apps(sia).values()
        for on in app.types.values()
        for e in on.split_errors()
    ]
    values = np.array(errors)
    return {
        "median": round(float(np.median(values)), 4),
        "p90": round(float(np.quantile(values, 0.9)), 4),
        "rows": len(errors),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sia", type=Path, required=True, help="Sia's sia-simulator folder")
    parser.add_argument(
        "--sia-runs", type=Path, required=True, help="folder of Sia's logs, <workload>.log"
    )
    parser.add_argument("--workloads", nargs="+", default=list(SATURN))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--mix",
        action="store_true",
        help="also play goodput-mixed (jobs may run across GPU types), paired against goodput",
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    for policy in policies:
        if policy not in POLICIES:
            parser.error(f"--policies: {policy!r} is not one of {', '.join(POLICIES)}")
    report: dict[str, Any] = {"workloads": {}, "pooled": {}}
    if args.mix:
        if "goodput" not in policies:
            parser.error("--mix is paired against goodput: keep it in --policies")
        policies.append(MIXED)
        report["mixed_step_check"] = split_errors(args.sia)
        check = report["mixed_step_check"]
        print(
            f"mixed step's compute + sync against the traced step on {check['rows']} rows: "
            f"median error {check['median']:.1%}, 90th percentile {check['p90']:.1%}"
        )
    pairs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {p: [] for p in policies}
    mixed_pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    for name in args.workloads:
        path = args.sia / "workloads" / name
        log = args.sia_runs / f"{Path(name).stem}.log"
        if not path.is_file():
            parser.error(f"no workload {path}")
        if not log.is_file():
            print(f"{name}: no Sia log {log}, left out", file=sys.stderr)
            continue
        theirs = sia_jcts(log)
        row: dict[str, Any] = {"sia_avg_jct_h": sum(theirs.values()) / len(theirs) / 3600}
        jcts: dict[str, dict[str, float]] = {}
        for policy in policies:
            mixed = policy == MIXED
            ours = play(path, args.sia, policy="goodput" if mixed else policy, mix=mixed)
            jcts[policy] = ours["jcts_s"]
            mean, low, high = paired_difference(ours["jcts_s"], theirs)
            row[policy] = {
                "avg_jct_h": round(ours["avg_jct_h"], 4),
                "vs_sia": round(ours["avg_jct_h"] / row["sia_avg_jct_h"] - 1, 4),
                "paired_difference": [round(mean, 4), round(low, 4), round(high, 4)],
                "restarts": ours["restarts"],
            }
            pairs[policy].append((ours["jcts_s"], theirs))
            line = (
                f"{name} {policy}: {ours['avg_jct_h']:.3f} h against Sia's "
                f"{row['sia_avg_jct_h']:.3f} h; per job {mean:+.1%} [{low:+.1%}, {high:+.1%}]"
            )
            if mixed:
                one = jcts["goodput"]
                m, lo, hi = paired_difference(ours["jcts_s"], one)
                row[policy]["vs_goodput"] = [round(m, 4), round(lo, 4), round(hi, 4)]
                row[policy]["mixed_gpu_rounds"] = round(ours["mixed_gpu_rounds"], 4)
                mixed_pairs.append((ours["jcts_s"], one))
                line += (
                    f"; against one type per job {m:+.1%} [{lo:+.1%}, {hi:+.1%}], "
                    f"{ours['mixed_gpu_rounds']:.1%} of busy GPU-rounds across types"
                )
            print(line)
        report["workloads"][name] = row
        if args.json_out is not None:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if not report["workloads"]:
        print("no workload had a Sia log", file=sys.stderr)
        return 1
    if mixed_pairs:
        mean, low, high = pooled_difference(mixed_pairs)
        below = sum(
            1
            for r in report["workloads"].values()
            if r[MIXED]["avg_jct_h"] < r["goodput"]["avg_jct_h"]
        )
        report["pooled"]["mixed_vs_goodput"] = {
            "paired_difference": [round(mean, 4), round(low, 4), round(high, 4)],
            "workloads_below_goodput": below,
            "workloads": len(mixed_pairs),
        }
        print(
            f"{MIXED} against goodput, {len(mixed_pairs)} workload(s): per job {mean:+.1%} "
            f"[{low:+.1%}, {high:+.1%}]; below on {below}"
        )
    for policy, done in pairs.items():
        mean, low, high = pooled_difference(done)
        below = sum(1 for r in report["workloads"].values() if r[policy]["vs_sia"] < 0)
        report["pooled"][policy] = {
            "paired_difference": [round(mean, 4), round(low, 4), round(high, 4)],
            "workloads_below_sia": below,
            "workloads": len(done),
        }
        print(
            f"{policy}, {len(done)} workload(s): per job {mean:+.1%} [{low:+.1%}, {high:+.1%}]"
            f" against Sia; below Sia on {below} of {len(done)}"
        )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
