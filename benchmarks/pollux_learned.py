"""The learned policy against Pollux in the Pollux-compatible world, each workload held
out of its own training: the protocol of ``autotune.studies.pollux.protocol`` (its
docstring says what is chosen on what), run and tabled.

    python bench/pollux_learned.py --pollux ../shared/data/pollux --held-out 6 --seeds 0,1,2
    python bench/pollux_learned.py --pollux ../shared/data/pollux --held-out 1-8 --seeds 0
    python bench/pollux_learned.py --out bench/out/pollux_learned --table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.benchmarks import OUT
from autotune.studies.pollux.protocol import (
    POLLUX,
    ablation,
    baselines,
    fold,
    table,
    teacher,
    workloads,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pollux", type=Path, help="the Pollux data folder")
    parser.add_argument("--held-out", default="6", help="workloads to hold out, e.g. 1-8")
    parser.add_argument("--seeds", default="0", help="training seeds, e.g. 0,1,2")
    parser.add_argument("--iterations", type=int, default=10, help="PPO iterations per fold")
    parser.add_argument("--train-batch", type=int, default=2048, help="env steps per iteration")
    parser.add_argument(
        "--residual",
        action="store_true",
        help="a residual policy: it corrects its teacher's weights, zero correction is the teacher",
    )
    parser.add_argument(
        "--pooled", action="store_true", help="each job's policy reads a summary of all jobs"
    )
    parser.add_argument(
        "--from-scratch", action="store_true", help="no imitation of the teacher before PPO"
    )
    parser.add_argument("--env-runners", type=int, default=0, help="sampling processes")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="iterations between checkpoints that selection weighs too (default: last only)",
    )
    parser.add_argument("--out", type=Path, default=OUT / "pollux_learned")
    parser.add_argument("--table", action="store_true", help="only print the table of OUT")
    parser.add_argument(
        "--ablation",
        action="append",
        default=None,
        metavar="LABEL=OUT",
        help="only print training variants side by side; repeat for each variant",
    )
    parser.add_argument(
        "--teachers-only", action="store_true", help="only choose the folds' teacher exponents"
    )
    args = parser.parse_args()
    if args.ablation:
        variants = dict(part.split("=", 1) for part in args.ablation)
        print(ablation({label: Path(out) for label, out in variants.items()}))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.table:
        print(table(args.out))
        return 0
    if args.pollux is None:
        parser.error("--pollux is required (or --table)")
    pollux = args.pollux.resolve()
    for w in workloads(args.held_out):
        path = args.out / f"baselines-{w}.json"
        if not path.exists() and not args.teachers_only:
            path.write_text(json.dumps(baselines(pollux, w), indent=1) + "\n")
        chosen = teacher(pollux, w, args.out)
        (args.out / f"teacher-{w}.json").write_text(json.dumps(chosen, indent=1) + "\n")
        exponent, p = chosen["exponent"], chosen["p"]
        if args.teachers_only:
            continue
        for seed in workloads(args.seeds):
            path = args.out / f"fold-{w}-seed-{seed}.json"
            if path.exists():
                done = json.loads(path.read_text())
                same = (
                    done.get("teacher_exponent"),
                    done.get("fairness_p"),
                    done.get("residual", False),
                    done.get("pooled", False),
                    done.get("imitate", True),
                ) == (exponent, p, args.residual, args.pooled, not args.from_scratch)
                if same:
                    continue
                print(f"  fold {w} seed {seed}: redone with exponent {exponent}, p {p}")
            row = fold(
                pollux,
                w,
                seed,
                args.out,
                iterations=args.iterations,
                train_batch=args.train_batch,
                exponent=exponent,
                p=p,
                residual=args.residual,
                pooled=args.pooled,
                env_runners=args.env_runners,
                checkpoint_every=args.checkpoint_every,
                imitate=not args.from_scratch,
            )
            path.write_text(json.dumps(row, indent=1) + "\n")
            print(
                f"workload {w} held out, seed {seed}: learned ({row['chosen']}) "
                f"{row['learned']['avg_jct_s']:.0f} s, Pollux {POLLUX[w]} s; training "
                f"{row['training']['wall_s']:.0f} s",
                flush=True,
            )
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
