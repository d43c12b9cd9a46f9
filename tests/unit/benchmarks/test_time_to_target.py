"""The time-to-target benchmark's arithmetic: the loss averaged over a window, the first
step at the target, each recipe's configuration, and the summary over seeds (a run that
missed the target has no time; the grid's best is the fastest fixed configuration)."""

from __future__ import annotations

import pytest

from autotune.benchmarks.time_to_target import (
    COMBINATIONS,
    KNOBS,
    REFERENCE,
    TOPK_SHARES,
    Curve,
    job_config,
    summarise,
)


def test_a_curve_reaches_the_target_when_its_window_mean_does() -> None:
    curve = Curve(started=100.0, window=3, losses={}, at={})
    for step, loss in enumerate([5.0, 4.0, 3.0, 2.0, 1.0], start=1):
        curve.add(step, loss, when=100.0 + step)
    assert curve.smoothed(2) is None, "not a whole window yet"
    assert curve.smoothed(3) == pytest.approx(4.0)
    assert curve.reached(3.0) == 4  # (4 + 3 + 2) / 3
    assert curve.reached(0.5) is None
    curve.add(4, 9.0, when=200.0)  # redone after a restart: the newer record stands
    assert curve.reached(3.0) is None
    assert curve.smoothed(5) == pytest.approx((3.0 + 9.0 + 1.0) / 3)


def test_every_recipe_is_a_valid_configuration_on_two_and_four_machines() -> None:
    for machines in (2, 4):
        assert job_config(machines, "").layout.dp == machines
        for recipe in (*KNOBS.values(), *COMBINATIONS.values(), *TOPK_SHARES.values()):
            config = job_config(machines, recipe)
            assert config.world_size == machines
    assert job_config(2, KNOBS["tp2"]).layout.tp == 2
    assert job_config(4, KNOBS["pp2"]).layout.dp == 2
    assert job_config(2, KNOBS["powersgd-4"]).compression.rank == 4
    assert job_config(2, TOPK_SHARES["topk-adaptive"]).compression.ratio == 0.01
    with pytest.raises(ValueError, match="must divide"):
        job_config(3, KNOBS["tp2"])


def test_the_summary_gives_medians_speedups_and_the_grids_best() -> None:
    def row(config: str, seed: int, t: float | None, fixed: bool = True) -> dict[str, object]:
        out: dict[str, object] = {"config": config, "seed": seed, "time_to_target_s": t}
        if fixed:
            out["recipe"] = ""
        return out

    runs = [
        row(REFERENCE, 0, 100.0), row(REFERENCE, 1, 120.0),
        row("int8", 0, 50.0), row("int8", 1, 60.0),
        row("bf16", 0, None), row("bf16", 1, 200.0),
        row("learned (daemon)", 0, 40.0, fixed=False),
        row("learned (daemon)", 1, 80.0, fixed=False),
        {**row("topk-adaptive", 0, 30.0), "adaptive": True},
        {**row("topk-adaptive", 1, 70.0), "adaptive": True},
    ]  # fmt: skip
    summary = summarise(runs)
    assert summary["int8"]["time_to_target_s_median"] == pytest.approx(55.0)
    assert summary["int8"]["speedup_vs_ddp_median"] == pytest.approx(2.0)
    assert summary["bf16"]["time_to_target_s_median"] is None, "one seed missed the target"
    assert summary["bf16"]["reached"] == 1
    # Neither a served policy nor adaptive top-k is part of the grid: the best fixed
    # configuration is int8.
    assert summary["grid_best"] == {"0": "int8", "1": "int8"}
    assert summary["learned (daemon)"]["of_grid_best_median"] == pytest.approx(
        (50 / 40 + 60 / 80) / 2
    )
    assert summary["topk-adaptive"]["of_grid_best_median"] == pytest.approx(
        (50 / 30 + 60 / 70) / 2, abs=1e-3
    )
