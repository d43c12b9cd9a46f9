"""Online per-job fitting on Pollux's traces: how well a job's model predicts its other
placements after the scheduler has seen it on a few small ones.

For each of the six applications
(``autotune.studies.pollux.online_fit.score_online_fit``): observe it on 1 GPU, then one
whole node ("4"), then two ("44"), fitting ``OnlineFit`` online after each; report the
step-time MAPE on every row of ``placements.csv`` at a placement it was not observed on
and on all of ``scalability.csv`` (6-16 nodes), after 1, 2 and 3 placements; for one
local batch per placement (the median traced one) and for every traced local batch; from
a leave-one-application-out prior and from the literature defaults; beside the prior
alone and the offline fit (the shipped coefficients, fitted on all rows, the test rows
included). Then the means for the other observation orders (``--sequence``, repeatable;
by default also 1 -> 2 -> 4 and 1 -> 4 -> 444). Deterministic: no randomness anywhere.

    python bench/online_fit.py [--pollux ../shared/data/pollux/traces]
        [--json-out bench/out/online_fit.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO
from autotune.studies.pollux.online_fit import SEQUENCE, VARIANTS, score_online_fit

ALTERNATIVES = (("1", "2", "4"), ("1", "4", "444"))


def _pct(values: list[float]) -> str:
    return " / ".join(f"{v:6.1%}" for v in values)


def print_table(report: dict[str, Any]) -> None:
    seq = " -> ".join(report["sequence"])
    print(f"observed {seq}; step-time MAPE on the unobserved rows after 1 / 2 / 3 placements")
    header = f"{'app':12s} {'n_test':>6s} {'offline':>7s} | {'prior':>6s}"
    for variant in VARIANTS:
        header += f" | {variant + ' (1/2/3)':>24s}"
    for prior in ("loo", "defaults"):
        print(f"\nprior: {prior}")
        print(header)
        for app, row in report["apps"].items():
            line = f"{app:12s} {row['n_test']:6d} {row['offline']:7.1%} | "
            line += f"{row[prior]['prior_only']:6.1%}"
            for variant in VARIANTS:
                line += f" | {_pct(row[prior][variant]['after']):>24s}"
            print(line)
        summary = report["summary"]
        for stat in ("mean", "median"):
            line = f"{stat:12s} {'':6s} {summary['offline'][stat]:7.1%} | "
            line += f"{summary[prior]['prior_only'][stat]:6.1%}"
            for variant in VARIANTS:
                line += f" | {_pct(summary[prior][variant][stat]):>24s}"
            print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = REPO.parent / "shared" / "data" / "pollux" / "traces"
    parser.add_argument("--pollux", type=Path, default=default, help="the traces folder")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--sequence",
        action="append",
        help="another observation order to report, comma-separated (e.g. 1,2,4)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    main_report = score_online_fit(args.pollux)
    print_table(main_report)
    alternatives = [tuple(s.split(",")) for s in args.sequence] if args.sequence else ALTERNATIVES
    others: dict[str, Any] = {}
    print("\nother observation orders: mean (median) MAPE after 1 / 2 / 3 placements")
    for seq in alternatives:
        report = score_online_fit(args.pollux, sequence=seq, placements=len(seq))
        name = "-".join(seq)
        others[name] = report
        for prior in ("loo", "defaults"):
            for variant in VARIANTS:
                stats = report["summary"][prior][variant]
                print(
                    f"  {' -> '.join(seq):14s} {prior:8s} {variant:11s} "
                    f"{_pct(stats['mean'])}  ({_pct(stats['median'])})"
                )
    elapsed = time.perf_counter() - began
    print(f"\n{elapsed:.1f} s")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        out = {"sequence": list(SEQUENCE), "main": main_report, "alternatives": others}
        args.json_out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
