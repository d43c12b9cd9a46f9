"""The learned policy against Sia in Sia's world, every workload held out of its training
(``autotune.studies.sia.protocol``: two folds, each trained on five Helios workloads and
tested on the other five and on four Philly ones).

Train and test a fold (one per core: ``--folds a`` and ``--folds b`` side by side)::

    python bench/sia_learned.py --sia /path/to/sia-simulator --folds a --seed 0 \\
        --iterations 40 --checkpoint-every 10 --out bench/out/sia_learned

then the table against Sia's own runs (its ``--output`` logs as
``RUNS/saturn/workload-N.log`` and ``RUNS/philly/workload-N.log``; how they were made:
``bench/sia_against.py``)::

    python bench/sia_learned.py --sia /path/to/sia-simulator --out bench/out/sia_learned \\
        --table --sia-runs RUNS
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.studies.sia.learned import QUANTUM
from autotune.studies.sia.protocol import FOLDS, fold, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sia", type=Path, required=True, help="Sia's sia-simulator folder")
    parser.add_argument("--out", type=Path, required=True, help="folder of the folds' results")
    parser.add_argument("--folds", default=",".join(FOLDS), help="folds to run, e.g. a,b")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--iterations", type=int, default=40, help="PPO iterations per fold")
    parser.add_argument("--train-batch", type=int, default=2048, help="env steps per iteration")
    parser.add_argument(
        "--checkpoint-every", type=int, default=10, help="iterations between selectable checkpoints"
    )
    parser.add_argument(
        "--quantum", type=float, default=QUANTUM, help="step the corrections are rounded to"
    )
    parser.add_argument("--table", action="store_true", help="print the table and stop")
    parser.add_argument("--sia-runs", type=Path, help="Sia's logs, <set>/<workload>.log")
    args = parser.parse_args(argv)
    if not (args.sia / "workloads").is_dir():
        parser.error(f"--sia {args.sia}: no workloads folder (the artifact's sia-simulator/)")
    if args.table:
        if args.sia_runs is None:
            parser.error("--table needs --sia-runs")
        print(table(args.out, args.sia_runs))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in (f for f in args.folds.split(",") if f):
        if name not in FOLDS:
            parser.error(f"--folds: {name!r} is not one of {', '.join(FOLDS)}")
        result = fold(
            args.sia,
            name,
            args.seed,
            args.out,
            iterations=args.iterations,
            train_batch=args.train_batch,
            checkpoint_every=args.checkpoint_every,
            quantum=args.quantum,
        )
        print(f"fold {name}: chose {result['chosen']}, {result['training']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
