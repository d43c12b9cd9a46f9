"""``bench/unseen_clusters.py``: the learned policy against rules on clusters no training
drew."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.benchmarks import unseen_clusters
from autotune.envs.presets import CLUSTER_MODELS


def test_the_named_shapes_hold_gpu_models_no_training_draws() -> None:
    built = {name: make() for name, make in unseen_clusters.shapes(draws=2).items()}
    assert list(built)[:2] == ["philly-64xP100", "lab-16xH100+32xV100-16GB"]
    assert {n.gpu_model for n in built["philly-64xP100"]} == {"P100"}
    assert {n.gpu_model for n in built["lab-16xH100+32xV100-16GB"]} == {"H100", "V100M16"}
    for name in ("philly-64xP100", "lab-16xH100+32xV100-16GB"):
        assert {n.gpu_model for n in built[name]} - set(CLUSTER_MODELS)
    assert built["drawn-0"] != built["drawn-1"]


def test_both_policies_play_the_same_jobs_on_a_drawn_shape(tmp_path: Path) -> None:
    report = unseen_clusters.run(
        checkpoint=None, draws=1, seeds=1, window=4, only=["drawn-0"], out=tmp_path / "r.json"
    )
    assert json.loads((tmp_path / "r.json").read_text()) == report
    entry = report["shapes"]["drawn-0"]
    assert list(report["shapes"]) == ["drawn-0"]
    rules, ppo = entry["policies"]["rules"], entry["policies"]["ppo"]
    assert rules["n_jobs_done"] == ppo["n_jobs_done"] == entry["jobs"] > 0
    assert entry["ppo_jct_vs_rules"] == pytest.approx(ppo["avg_jct_s"] / rules["avg_jct_s"])
    assert entry["ppo_goodput_vs_rules"] == pytest.approx(ppo["goodput"] / rules["goodput"])
