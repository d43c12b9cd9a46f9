"""Training survives a hung rank (a lost machine: ``tests/testbed/test_recovery.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.core import JobConfig, Layout
from autotune.executor.runner import JobRunner, RunnerConfig

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]


def test_a_hung_rank_is_taken_for_dead_and_the_job_finishes(local_ray: str) -> None:
    sys.path.insert(0, str(REPO / "tests" / "data"))
    try:
        from hang_task import HANG_AT, HANG_MARKER
    finally:
        sys.path.pop(0)
    HANG_MARKER.touch()
    try:
        runner = JobRunner(
            RunnerConfig(
                task=f"{REPO / 'tests' / 'data' / 'hang_task.py'}:HangOnce",
                steps=8,
                checkpoint_every=2,
                step_timeout_s=10.0,
            ),
            JobConfig(layout=Layout(world_size=2)),
        )
        result = runner.run()
    finally:
        HANG_MARKER.unlink(missing_ok=True)
    assert result.steps == 8
    hung = [e for e in result.events if e["kind"] == "rank_hung"]
    assert len(hung) == 1
    assert hung[0]["step"] == HANG_AT
    assert "gave no answer within 10 s" in hung[0]["detail"]
    assert hung[0]["resumed_from"] == 2
    assert result.steps_redone == HANG_AT - 2
