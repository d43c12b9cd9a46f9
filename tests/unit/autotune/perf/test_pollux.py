"""Calibration against the Pollux measurements and the `autotune model` commands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import autotune_command

from autotune.errors import InputError
from autotune.perf.pollux import (
    APPS,
    POLLUX_APPS,
    calibrate,
    coefficients,
    target_samples,
    validate,
)


def test_validate_reports_held_out_error(pollux_dir: Path) -> None:
    report = validate(pollux_dir / "traces")
    assert set(report["apps"]) == set(APPS)
    for row in report["apps"].values():
        assert row["n_fit"] > 0
        assert row["n_test"] > row["n_fit"]
        assert 0 < row["mape_step_time"] < 1.0
    mean = sum(r["mape_step_time"] for r in report["apps"].values()) / len(APPS)
    assert report["mape_step_time_mean"] == pytest.approx(mean, abs=1e-3)


@pytest.mark.slow
def test_shipped_calibration_is_what_calibrate_computes(pollux_dir: Path) -> None:
    fresh = calibrate(pollux_dir / "traces")
    for app in APPS:
        row = fresh["apps"][app]
        assert row["target_samples"] == target_samples(app)
        assert row["reference_batch"] == POLLUX_APPS[app].reference_batch
        for name, value in row["coefficients"].items():
            assert getattr(coefficients(app), name) == pytest.approx(value, rel=1e-3, abs=1e-6)


def test_bad_placement_names_file_row_and_column(tmp_path: Path) -> None:
    app = tmp_path / "bert"
    app.mkdir()
    (app / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,4,0.4,0.01\n1x,4,0.4,0.01\n"
    )
    (app / "validation-12.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n1,1,1,1,1\n"
    )
    with pytest.raises(InputError, match=r"placements\.csv.*row 3.*placement"):
        validate(tmp_path, apps=("bert",))


@pytest.mark.subprocess
def test_model_validate_command_prints_json(pollux_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *autotune_command(),
            "model",
            "validate",
            "--pollux",
            str(pollux_dir / "traces"),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["apps"]) == set(APPS)
    assert {"n_fit", "n_test", "mape_step_time", "mape_sync_time"} <= set(report["apps"]["bert"])
    assert isinstance(report["mape_step_time_mean"], float)


@pytest.mark.subprocess
def test_model_validate_rejects_a_missing_folder(tmp_path: Path) -> None:
    result = subprocess.run(
        [*autotune_command(), "model", "validate", "--pollux", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "not found" in result.stderr
