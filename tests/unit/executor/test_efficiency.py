"""A task's efficiency under a compression: the arithmetic on loss curves (``autotune
calibrate --efficiency`` measuring it for real: ``test_cluster_calibration``)."""

from __future__ import annotations

import math

import pytest

from autotune.core import MAX_COMPRESSION_EFFICIENCY
from autotune.errors import InputError
from autotune.executor.efficiency import (
    MIN_EFFICIENCY,
    WINDOW,
    efficiency_of,
    noise_scale_of,
    reached,
    smoothed,
    task_efficiency,
)


def test_smoothing_and_the_first_step_at_a_target() -> None:
    losses = [float(20 - i) for i in range(20)]
    curve = smoothed(losses)
    assert curve[0] == 20.0
    assert curve[WINDOW - 1] == pytest.approx(sum(losses[:WINDOW]) / WINDOW)
    assert curve[-1] == pytest.approx(sum(losses[-WINDOW:]) / WINDOW)
    assert reached(curve, curve[12]) == 13
    assert reached(curve, 0.0) is None


def test_efficiency_is_dense_steps_over_compressed_steps_priced_in_dense_progress() -> None:
    dense = [10.0 - 0.1 * i for i in range(50)]  # target 5.1, reached at step 50
    # Twice as slow: the target at step 99.
    slow = [10.0 - 0.05 * i for i in range(100)]
    found = efficiency_of("topk:0.01", 3, dense, slow)
    assert (found.compression, found.seed, found.dense_steps, found.steps) == (
        "topk:0.01",
        3,
        50,
        99,
    )
    assert found.efficiency == pytest.approx(50 / 99)
    # Never there within its 60 steps: its last loss (7.05) dense reached at step 31.
    short = slow[:60]
    missed = efficiency_of("topk:0.01", 0, dense, short)
    assert missed.steps is None
    assert missed.efficiency == pytest.approx(reached(dense, short[-1]) / 60)
    assert reached(dense, short[-1]) == 31
    # Faster than dense: the run says so (up to MAX_COMPRESSION_EFFICIENCY).
    fast = [10.0 - 0.2 * i for i in range(50)]
    assert efficiency_of("int8", 0, dense, fast).efficiency == pytest.approx(50 / 26)
    assert efficiency_of("int8", 0, dense, fast).to_json()["steps"] == 26
    at_once = [5.0] * 50
    assert efficiency_of("int8", 0, dense, at_once).efficiency == MAX_COMPRESSION_EFFICIENCY


def test_a_task_is_credited_for_beating_dense_only_on_every_seed() -> None:
    # Faster on one seed, slower on another: the median, at most 1.
    assert task_efficiency([1.9, 0.8, 1.2]) == 1.0
    assert task_efficiency([1.9, 0.8, 0.7]) == 0.8
    # Faster on every seed (top-k 1% on gpt-char: 2.2, 3.5, 1.28): the median.
    assert task_efficiency([2.2, 3.5, 1.28]) == 2.2
    # One seed cannot tell a gain from chance.
    assert task_efficiency([1.5]) == 1.0
    with pytest.raises(ValueError, match="no runs"):
        task_efficiency([])


def test_a_diverged_run_is_priced_by_the_progress_it_made_and_a_diverged_reference_refused() -> (
    None
):
    dense = [10.0 - 0.1 * i for i in range(50)]
    # Down to 8.05 (where dense was at step 21), then NaN: not half of dense's progress.
    diverged = [10.0 - 0.05 * i for i in range(40)] + [math.nan] * 20
    found = efficiency_of("fp8", 0, dense, diverged)
    assert found.steps is None
    assert found.efficiency == pytest.approx(reached(dense, min(diverged[:40])) / 60)
    assert found.to_json()["final_loss"] is None
    never = efficiency_of("fp8", 0, dense, [math.inf] * 60)
    assert never.efficiency == MIN_EFFICIENCY
    with pytest.raises(InputError, match="plain DDP's loss is nan"):
        efficiency_of("fp8", 0, [*dense[:-1], math.nan], diverged)


def test_a_runs_noise_scale_is_measured_as_the_runner_measures_it() -> None:
    """Two replicas of 8 samples whose gradients have |G|^2 = 10 and tr(S) = 320: the
    estimator finds 320 / 10 = 32 samples, once it has enough steps."""
    from autotune.executor.local import LocalRun
    from autotune.executor.quality import NOISE_MIN_MEASUREMENTS, Quality
    from autotune.executor.reports import RankStep

    def step(rank: int, number: int) -> RankStep:
        quality = Quality(
            replica_sq=10 + 320 / 8, update_sq=0.0, class_norms={}, dense_sq=10 + 320 / 16
        )
        return RankStep(
            rank=rank, step=number, loss=1.0, samples=8, step_time_s=0.1, sync_time_s=0.0,
            bytes_sent=0, bytes_dense=0, events=(), peak_memory_bytes=0, power_watts=None,
            fp8_mode=None, quality=quality,
        )  # fmt: skip

    def run(steps: int) -> LocalRun:
        reports = [[step(rank, n) for n in range(1, steps + 1)] for rank in (0, 1)]
        return LocalRun(setup=[], reports=reports, memory_after_setup=[], memory=[], state=None)

    assert noise_scale_of(run(20)) == pytest.approx(32.0)
    assert noise_scale_of(run(NOISE_MIN_MEASUREMENTS - 1)) is None
