"""The executor's benchmarks run and print what they promise (their figures are in
bench/RESULTS.md; speed is judged there, not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.subprocess]


def _run(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        cwd=REPO.parent,  # not the checkout: its bare autotune/ folder would shadow the package
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_the_overhead_benchmark_compares_the_executor_with_plain_pytorch() -> None:
    report = _run("executor_overhead.py", "--steps", "11")
    for key in ("plain_loop_step_s", "plain_ddp2_step_s"):
        assert isinstance(report[key], float)
        assert report[key] > 0
    for key in ("executor_dp1", "executor_dp2"):
        figures = report[key]
        assert isinstance(figures, dict)
        assert 0 < figures["rank_step_s"] <= figures["job_step_s"]
    assert report["threads_per_rank"] == 1


def test_the_throughput_benchmark_times_a_user_task_from_outside() -> None:
    report = _run("task_throughput.py", "--steps", "6")
    layouts = report["layouts"]
    assert isinstance(layouts, dict)
    assert set(layouts) == {"dp1", "dp2", "pp2"}
    for row in layouts.values():
        assert row["samples_per_step"] == 16
        assert row["reported_samples_per_s"] > 0
        assert row["independent_samples_per_s"] > 0
