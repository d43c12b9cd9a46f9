"""The daemon on its defaults, run to the end: the learned policy against rules
(`python bench/daemon_policy.py --policy ppo` and `--policy rules`).

Builds the daemon exactly as `autotune daemon` does (settings, the simulated backend from
the backend registry, the policy, the rules fallback, a SQLite database) and ticks it
in-process, without the API and without waiting between ticks, until every job of the
stream has finished (or ``--max-ticks``). Prints one JSON object: ticks, failed ticks,
decisions by source, jobs finished, and the average and p99 simulated job completion
time read back from the database (``jct_s``, what ``GET /api/v1/jobs/{id}`` shows).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from autotune.daemon.backends import build_backend
from autotune.daemon.settings import load_settings
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.simulator import SimulatedCluster


def run(args: argparse.Namespace) -> dict[str, Any]:
    from autotune.policies.rules import RulesPolicy
    from autotune.policies.serving import LearnedPolicy

    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(
            data_dir=Path(tmp),
            seed=args.seed,
            round_s=args.round_s,
            sim_initial_jobs=args.initial_jobs,
            sim_max_jobs=args.max_jobs,
        )
        backend = build_backend(settings)
        assert isinstance(backend, SimulatedCluster)
        database = Database(settings.database_url)
        database.upgrade()
        if args.policy == "rules":
            policy: Any = RulesPolicy()
        else:
            policy = LearnedPolicy(
                args.checkpoint, round_s=settings.round_period_s, every_job=args.every_job
            )
        daemon = Daemon(
            DaemonParts(db=database, backend=backend, policy=policy, fallback=RulesPolicy())
        )
        daemon.start()
        sources: Counter[str] = Counter()
        failed = ticks = 0
        started = time.perf_counter()
        while ticks < args.max_ticks:
            ticks += 1
            try:
                report = daemon.tick()
            except Exception:  # counted: the goal is none
                failed += 1
                continue
            sources.update(d.source for d in report.decisions)
            snapshot = backend.snapshot()
            if len(snapshot.jobs) >= args.max_jobs and not snapshot.by_state("pending", "running"):
                break
        with database.session() as session:
            records = repo.list_jobs(session=session, limit=1_000_000).rows
        database.dispose()
        if args.keep_db is not None:
            args.keep_db.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / "autotune.db", args.keep_db)
    jct = np.array([r.jct_s for r in records if r.state == "finished" and r.jct_s is not None])
    total = sum(sources.values())
    return {
        "policy": policy.version,
        "seed": args.seed,
        "round_s": settings.round_period_s,
        "initial_jobs": args.initial_jobs,
        "max_jobs": args.max_jobs,
        "ticks": ticks,
        "failed_ticks": failed,
        "decisions": dict(sources),
        "policy_share": sources.get("policy", 0) / total if total else 0.0,
        "jobs": len(records),
        "finished": int(sum(r.state == "finished" for r in records)),
        "failed_jobs": int(sum(r.state == "failed" for r in records)),
        "avg_jct_s": float(jct.mean()) if jct.size else None,
        "p99_jct_s": float(np.percentile(jct, 99)) if jct.size else None,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", choices=["ppo", "rules"], default="ppo")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument(
        "--every-job",
        action="store_true",
        help="the learned policy decides every active job, not only its 32 slots",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--round-s", type=float, default=None)
    parser.add_argument("--initial-jobs", type=int, default=40)
    parser.add_argument("--max-jobs", type=int, default=300)
    parser.add_argument("--max-ticks", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON here.")
    parser.add_argument(
        "--keep-db",
        type=Path,
        default=None,
        help="Copy the run's SQLite database (jobs, every decision with its reason) here.",
    )
    args = parser.parse_args()
    result = run(args)
    text = json.dumps(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
