"""A task's efficiency under a compression: the arithmetic on loss curves (``autotune
calibrate --efficiency`` measuring it for real: ``test_cluster_calibration``)."""

from __future__ import annotations

import math

import pytest

from autotune.errors import InputError
from autotune.executor.efficiency import (
    MIN_EFFICIENCY,
    WINDOW,
    efficiency_of,
    reached,
    smoothed,
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
    # Faster than dense by chance: charged nothing, not rewarded.
    fast = [10.0 - 0.2 * i for i in range(50)]
    assert efficiency_of("int8", 0, dense, fast).efficiency == 1.0
    assert efficiency_of("int8", 0, dense, fast).to_json()["steps"] == 26


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
