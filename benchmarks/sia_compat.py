"""The Sia-compatible mode against Sia's own simulator, workload by workload.

Both simulators play the same Sia workloads under the same policy, first come first
served on the fastest GPU type with room (``autotune.studies.sia.fifo``): ours in the
Sia-compatible world (``autotune.studies.sia.world``: Sia's cluster, its per-type
measured physics, 60 s rounds, each application's restart cost), Sia's with its own
``Cluster``, ``Job`` and traces (``bench/sia_fifo_anchor.py``, which runs in a Python
environment that can import Sia's simulator). The report sets the average JCTs side by
side, per job too::

    python bench/sia_compat.py --sia /path/to/sia-simulator \\
        --sia-python /path/to/sia-venv/bin/python \\
        [--workloads saturn/workload-1.csv ...] [--json-out bench/out/sia_compat.json]

``--sia-python`` runs Sia's simulator through ``bench/sia_fifo_anchor.py`` first;
``--anchor FILE`` reads a JSON that script wrote instead. Workloads are paths relative
to ``<sia>/workloads`` (default: the ten ``saturn`` workloads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.studies.sia.fidelity import SATURN, compare, play

ANCHOR = Path(__file__).resolve().parents[1] / "bench" / "sia_fifo_anchor.py"
"""The script that runs the shared policy in Sia's simulator (repository checkout)."""


def _anchor(python: Path, sia: Path, paths: list[Path], out: Path) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    command = [str(python), str(ANCHOR), "--sia", str(sia), "--out", str(out)]
    subprocess.run([*command, *map(str, paths)], check=True, env=env)
    return dict(json.loads(out.read_text()))


def _theirs(anchor: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The anchor's entry for a workload file (keyed by its stem or its path)."""
    workloads = anchor.get("workloads", {})
    for key, entry in workloads.items():
        if Path(entry.get("path", key)).resolve() == path.resolve():
            return dict(entry)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sia", type=Path, required=True, help="Sia's sia-simulator folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sia-python", type=Path, help="a Python that imports Sia's simulator")
    source.add_argument("--anchor", type=Path, help="a JSON bench/sia_fifo_anchor.py wrote")
    parser.add_argument("--workloads", nargs="+", default=list(SATURN))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    paths = [args.sia / "workloads" / w for w in args.workloads]
    for path in paths:
        if not path.is_file():
            parser.error(f"no workload {path}")
    if args.anchor is not None:
        anchor = json.loads(args.anchor.read_text())
    else:
        out = (args.json_out or Path("bench/out/sia_compat.json")).with_suffix(".anchor.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        anchor = _anchor(args.sia_python, args.sia, paths, out)
    report: dict[str, Any] = {"policy": "sia-fifo", "interval_s": 60, "workloads": {}}
    for name, path in zip(args.workloads, paths, strict=True):
        theirs = _theirs(anchor, path)
        if theirs is None:
            print(f"{name}: not in the anchor's JSON", file=sys.stderr)
            return 1
        ours = play(path, args.sia)
        row = compare(ours, theirs)
        row["ours_wall_s"], row["sia_wall_s"] = ours["wall_s"], theirs.get("wall_s")
        report["workloads"][name] = row
        print(
            f"{name}: ours {row['ours_avg_jct_h']:.3f} h, Sia {row['sia_avg_jct_h']:.3f} h "
            f"({row['relative_difference']:+.2%}); {row['jobs_within_1s']}/{row['jobs']} "
            f"jobs within 1 s, {row['same_first_placement']} on the same first placement"
        )
        if args.json_out is not None:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    worst = max(abs(r["relative_difference"]) for r in report["workloads"].values())
    report["largest_relative_difference"] = worst
    print(f"largest per-workload difference: {worst:.2%}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
