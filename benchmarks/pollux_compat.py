"""Tiresias in the Pollux-compatible mode against Pollux's own simulator, and where our
default world differs.

For each Pollux workload, Tiresias (``autotune.policies.tiresias``) runs through our
decision step in the Pollux-compatible mode (measured physics, Pollux's clock, 60 s
rounds, 30 s per start and restart; what ``autotune pollux eval`` runs) and its
average JCT is set beside the artifact simulator's (``results-jobload/tiresias-1.0``).
Then, on ``--decompose`` workloads, the same policy on the same jobs one change at a
time towards our default world (what ``autotune eval --pollux-workload`` runs):

- ``compat``: the Pollux-compatible mode;
- ``compat_300s``: measured physics with our default rounds (300 s) and no start cost;
- ``model_60s``: our performance model (per-application coefficients, work in samples
  at the reference batch) with Pollux's rounds and start cost, no noise;
- ``model_300s``: our performance model with our rounds and free starts, no noise;
- ``default``: our default world (model physics, 300 s rounds, free starts, stragglers
  and divergence drawn).

    python bench/pollux_compat.py --pollux ../shared/data/pollux \\
        [--workloads 1-8] [--decompose 6] [--optimus] [--goodput]
        [--json-out bench/out/pollux_compat.json]

``--optimus`` also runs Optimus (``autotune.studies.pollux.optimus``) beside the artifact's
(``results-jobload/optimus-1.0``); ``--goodput`` also runs the Pollux-style goodput
optimiser (``autotune.studies.pollux.goodput``) and sets its average JCT beside Pollux's
published one (``results-jobload/pollux-1.0``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autotune.studies.pollux.env import compat_arrivals
from autotune.studies.pollux.fidelity import decompose, run
from autotune.studies.pollux.protocol import POLLUX, POLLUX_OPTIMUS, POLLUX_TIRESIAS, workloads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pollux", type=Path, required=True, help="the Pollux data folder")
    parser.add_argument("--workloads", default="1-8")
    parser.add_argument("--decompose", default="6", help="workloads to decompose ('' none)")
    parser.add_argument(
        "--goodput", action="store_true", help="also run the Pollux-style goodput optimiser"
    )
    parser.add_argument(
        "--optimus", action="store_true", help="also run Optimus against the artifact's"
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    traces = args.pollux / "traces"
    report: dict[str, Any] = {"pollux_tiresias": POLLUX_TIRESIAS, "workloads": {}}
    for n in workloads(args.workloads):
        path = args.pollux / "workloads" / f"workload-{n}.csv"
        row: dict[str, Any] = {"pollux_s": POLLUX_TIRESIAS[n]}
        compat = run(compat_arrivals(path, traces), round_s=60, start_s=30, noise=False)
        row["compat"] = compat
        row["compat_vs_pollux"] = round(compat["avg_jct_s"] / POLLUX_TIRESIAS[n] - 1, 4)
        if args.optimus:
            optimus = run(
                compat_arrivals(path, traces),
                round_s=60,
                start_s=30,
                noise=False,
                policy="optimus",
            )
            row["optimus"] = optimus
            row["optimus_vs_pollux"] = round(optimus["avg_jct_s"] / POLLUX_OPTIMUS[n] - 1, 4)
            print(
                f"workload {n}: Optimus {optimus['avg_jct_s']:7.0f} s (Pollux's simulator "
                f"{POLLUX_OPTIMUS[n]}, {row['optimus_vs_pollux']:+.1%})",
                flush=True,
            )
        if args.goodput:
            goodput = run(
                compat_arrivals(path, traces),
                round_s=60,
                start_s=30,
                noise=False,
                policy="goodput",
            )
            row["goodput"] = goodput
            row["pollux_published_s"] = POLLUX[n]
            row["goodput_vs_pollux"] = round(goodput["avg_jct_s"] / POLLUX[n] - 1, 4)
            print(
                f"workload {n}: goodput optimiser {goodput['avg_jct_s']:7.0f} s (Pollux "
                f"{POLLUX[n]}, {row['goodput_vs_pollux']:+.1%})",
                flush=True,
            )
        if args.decompose and n in workloads(args.decompose):
            row.update(decompose(path, traces))
        report["workloads"][n] = row
        print(
            f"workload {n}: Tiresias {compat['avg_jct_s']:7.0f} s (Pollux's simulator "
            f"{POLLUX_TIRESIAS[n]}, {row['compat_vs_pollux']:+.1%}), "
            f"{compat['preemptions']} preemptions, {compat['wall_s']} s"
            + "".join(
                f"; {k} {row[k]['avg_jct_s']:.0f} s"
                for k in ("compat_300s", "model_60s", "model_300s", "default")
                if k in row
            ),
            flush=True,
        )
    errors = [abs(r["compat_vs_pollux"]) for r in report["workloads"].values()]
    report["max_abs_error"] = max(errors)
    print(f"largest difference from Pollux's simulator: {report['max_abs_error']:.1%}")
    if args.goodput:
        rows = report["workloads"].values()
        report["goodput_mean_s"] = sum(r["goodput"]["avg_jct_s"] for r in rows) / len(rows)
        report["pollux_mean_s"] = sum(r["pollux_published_s"] for r in rows) / len(rows)
        print(
            f"goodput optimiser mean {report['goodput_mean_s']:.0f} s, Pollux "
            f"{report['pollux_mean_s']:.0f} s"
        )
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
