"""How fast ``autotune replay export`` turns logged rounds into Parquet.

Writes ``--rounds`` logged rounds of ``--jobs`` jobs each into a fresh SQLite database,
in the daemon's format (``autotune.replay.log``: compressed observation, per slot
the entries, mask and log-probabilities, the reward parts filled in), then times the
export of all of them: rows (one per job decision), files, bytes, seconds. The goal:
100,000 transitions in at most 30 s, into at most 4 files.

    python bench/replay_export.py --rounds 10000 --jobs 10 [--json-out bench/out/replay_export.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert

from autotune.core import utc_now
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.tables import TransitionRow
from autotune.replay.export import export
from autotune.rl.acting import action_mask
from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import HEADER, SLOT


def build(db: Database, rounds: int, jobs: int, seed: int = 0) -> None:
    """``rounds`` logged rounds, ``jobs`` jobs in the policy's slots each."""
    rng = np.random.default_rng(seed)
    start = utc_now() - timedelta(seconds=2 * rounds)
    used = HEADER + len(SLOT) * jobs
    batch: list[dict[str, Any]] = []
    for i in range(rounds):
        obs = rng.random(used, dtype=np.float32)
        entries = np.stack([rng.integers(0, n, jobs) for n in ACTION_DIMS], axis=1)
        running = rng.random(jobs) < 0.7
        mask = action_mask(entries, running)
        logp = np.where(mask, np.log(rng.uniform(0.01, 1.0, mask.shape)), 0.0)
        ids = [f"job-{(i // 50) * jobs + k:06d}" for k in range(jobs)]
        job_parts = {
            job: {
                "reward": float(g - 0.01),
                "goodput": float(g),
                "oom": 0.0,
                "nan": 0.0,
                "restart": 0.0,
                "energy": -0.01,
                "ended": False,
            }
            for job, g in zip(ids, rng.random(jobs), strict=True)
        }
        batch.append(
            {
                "episode": f"bench-{i // 288:04d}",
                "step": i % 288,
                "policy_version": "ppo-bench",
                "epsilon": 0.05,
                "sim_time_s": 300.0 * i,
                "observation": repo.pack_observation(obs, used),
                "slots": {
                    "jobs": ids,
                    "running": running.tolist(),
                    "entries": entries.tolist(),
                    "mask": mask.astype(int).tolist(),
                    "logp": np.round(logp, 6).tolist(),
                    "applied": [True] * jobs,
                },
                "reward": float(sum(p["reward"] for p in job_parts.values())),
                "reward_parts": {
                    "cluster": {"goodput": 1.0},
                    "jobs": job_parts,
                    "weights": {"round_s": 300.0, "energy_weight": 0.05},
                },
                "truncated": i % 288 == 287,
                "created_at": start + timedelta(seconds=2 * i),
            }
        )
        if len(batch) == 2000:
            with db.session() as session:
                session.execute(insert(TransitionRow), batch)
            batch = []
    if batch:
        with db.session() as session:
            session.execute(insert(TransitionRow), batch)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(sqlite_url(Path(tmp) / "log.db"))
        db.upgrade()
        began = time.perf_counter()
        build(db, args.rounds, args.jobs)
        built_s = time.perf_counter() - began
        db_bytes = (Path(tmp) / "log.db").stat().st_size
        db.dispose()
        report = export(db.url, Path(tmp) / "export")
        files = [Path(tmp) / "export" / f for f in report.files]
        result = {
            "rounds": args.rounds,
            "jobs_per_round": args.jobs,
            "rows": report.rows,
            "files": len(files),
            "parquet_bytes": sum(f.stat().st_size for f in files),
            "db_bytes": db_bytes,
            "db_bytes_per_round": round(db_bytes / args.rounds),
            "build_s": round(built_s, 1),
            "export_s": round(report.seconds, 2),
        }
    text = json.dumps(result)
    print(text)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
