"""The daemon on its defaults (``bench/daemon_policy.py``): two policies given one seed
schedule the same jobs, and the run's database can be kept for analysis."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

from autotune.benchmarks.daemon_policy import run


def test_rules_and_the_learned_policy_see_the_same_jobs_and_keep_their_databases(
    tmp_path: Path,
) -> None:
    def jobs(policy: str) -> tuple[dict[str, object], list[tuple[str, str, float]]]:
        db = tmp_path / f"{policy}.db"
        args = argparse.Namespace(
            policy=policy,
            checkpoint=None,
            every_job=False,
            seed=3,
            round_s=None,
            initial_jobs=4,
            max_jobs=12,
            max_ticks=400,
            keep_db=db,
        )
        result = run(args)
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT job_id, json_extract(spec, '$.model.name'), sim_submitted_s "
                "FROM jobs ORDER BY job_id"
            ).fetchall()
            decided = conn.execute("SELECT COUNT(DISTINCT job_id) FROM decisions").fetchone()[0]
        assert result["jobs"] == decided == 12, result
        assert result["failed_ticks"] == 0
        return result, rows

    rules, rules_jobs = jobs("rules")
    learned, learned_jobs = jobs("ppo")
    assert rules["policy"] != learned["policy"]
    assert len(rules_jobs) == 12
    assert rules_jobs == learned_jobs
