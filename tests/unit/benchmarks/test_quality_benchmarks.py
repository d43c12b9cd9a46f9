"""The training-quality benchmarks run end to end on a small task and write what they
say they write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.benchmarks import precision_guard, quality_overhead, quality_validation

pytestmark = pytest.mark.slow


def test_the_overhead_benchmark_times_measuring_against_not(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = ["--task", "mlp-synthetic:64", "--compression", "int8", "--steps", "10"]
    assert quality_overhead.main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["compression"] == "int8"
    assert 0 < row["measured_share"] < 1
    assert row["reference_steps"] >= 1
    assert row["cosine_median"] > 0.99


def test_the_validation_benchmark_reports_steps_to_the_dense_runs_loss(tmp_path: Path) -> None:
    out = tmp_path / "validation.json"
    argv = ["--task", "mlp-synthetic", "--setting", "int8", "--n-steps", "20", "--limit", "2"]
    assert quality_validation.main([*argv, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert 1 <= row["dense_steps"] <= 20
    assert row["steps_measured"] is None or row["steps_measured"] <= 40
    assert row["predicted_catalog"] == pytest.approx(row["dense_steps"] / 0.995)
    if row["steps_measured"] is not None:  # the efficiency as a calibration prices it
        assert row["efficiency"] == pytest.approx(row["dense_steps"] / row["steps_measured"])


def test_the_guard_benchmark_runs_every_arm(tmp_path: Path) -> None:
    out = tmp_path / "guard.json"
    argv = ["--task", "mlp-synthetic", "--steps", "5", "--seeds", "0", "--out", str(out)]
    assert precision_guard.main(argv) == 0
    arms = json.loads(out.read_text())["arms"]
    assert [a["arm"] for a in arms] == list(precision_guard.ARMS)
    assert all(a["nan_step_rate_max"] == 0 for a in arms)  # mlp-synthetic stays finite
