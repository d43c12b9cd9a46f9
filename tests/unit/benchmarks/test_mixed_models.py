"""``bench/mixed_models.py``: one job across GPU models against one model per job, on the
same jobs and seeds."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.benchmarks import mixed_models


def test_both_arms_play_the_same_jobs_and_pair_them(tmp_path: Path) -> None:
    report = mixed_models.run(
        seeds=1,
        window=8,
        policies=["rules"],
        only=["default-16xA100+8xV100+8xT4"],
        out=tmp_path / "r.json",
    )
    assert json.loads((tmp_path / "r.json").read_text()) == report
    entry = report["shapes"]["default-16xA100+8xV100+8xT4"]
    rules = entry["rules"]
    one, mixed = rules["one_model"], rules["mixed"]
    assert one["n_jobs_done"] == mixed["n_jobs_done"] == entry["jobs"] > 0
    assert one["mixed_gpu_share"] == 0.0  # nothing mixes without mix_models
    # Eight jobs leave room on one model for each: none mixes, and then turning mixing
    # on changes nothing at all.
    assert mixed["mixed_gpu_share"] == 0.0
    assert mixed == one
    paired = rules["paired_jct_diff_s"]
    assert paired == {"mean": 0.0, "low": 0.0, "high": 0.0, "pairs": entry["jobs"]}


def test_the_seeds_cluster_is_8_h100_beside_4_v100() -> None:
    nodes = mixed_models.SHAPES["8xH100+4xV100-32GB"]()
    assert sorted((n.gpu_model, n.gpu_count) for n in nodes) == [("H100", 8), ("V100M32", 4)]
