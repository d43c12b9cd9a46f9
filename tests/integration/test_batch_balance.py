"""A job whose second rank computes slower moves its batch shares to the ranks' speeds
while it trains, and its steps get shorter (the testbed measures it on machines slowed
with CPU quotas: ``bench/hetero_shares.py``)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from autotune.core import JobConfig, Layout
from autotune.executor.balance import WARMUP_STEPS, WINDOW
from autotune.executor.errors import ExecutorError, ParallelError
from autotune.executor.runner import JobRunner, RunnerConfig

pytestmark = pytest.mark.ray

TASK = f"{Path(__file__).resolve().parents[1] / 'data' / 'slow_rank_task.py'}:SlowSecondRank"


def test_the_slow_rank_gets_fewer_samples_and_the_step_shortens(local_ray: str) -> None:
    steps = 4 * (WARMUP_STEPS + WINDOW)
    result = JobRunner(
        RunnerConfig(task=TASK, steps=steps, batch_size=64, balance_batch=True),
        JobConfig.data_parallel(2),
    ).run()
    moves = [e for e in result.events if e["kind"] == "batch_shares"]
    assert moves, result.events
    first = moves[0]
    assert first["from"] == [32, 32]
    assert first["to"][0] > first["to"][1]
    assert sum(first["to"]) == 64
    assert first["seconds_per_sample"][1] > first["seconds_per_sample"][0]
    # Rank 1 sleeps 2 ms a sample: 64 ms at 32 samples, against a few ms of compute.
    before = statistics.median(result.wall_times_s[1 : first["step"]])
    after = statistics.median(result.wall_times_s[-WINDOW:])
    assert after < 0.7 * before, (before, after, moves)
    assert all(math.isfinite(loss) for loss in result.losses)


def test_uneven_shares_are_refused_where_they_cannot_apply() -> None:
    with pytest.raises(ExecutorError, match="positive numbers"):
        RunnerConfig(task="mlp-synthetic", steps=1, batch_shares=(1.0, 0.0))
    with pytest.raises(ParallelError, match="data-parallel-only"):
        JobRunner(
            RunnerConfig(task="gpt-char", steps=1, balance_batch=True),
            JobConfig(layout=Layout(world_size=2, tp=2)),
        )
