"""The held-out protocol's comparison with Pollux job by job (``bench/pollux_learned.py``
runs it): Pollux's per-job JCTs as shipped, the paired difference and its bootstrap
interval, and the tables it prints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.studies.pollux import protocol


def test_pollux_per_job_jcts_average_to_its_published_figures() -> None:
    jcts = protocol.pollux_jcts()
    assert sorted(jcts) == list(range(1, 9))
    for w, jobs in jcts.items():
        assert len(jobs) == 160
        assert round(float(np.mean(list(jobs.values())))) == protocol.POLLUX[w]
    assert "cifar10-0" in jcts[6]  # the job ids the Pollux-compatible mode gives its jobs


def test_paired_difference_is_the_relative_gap_in_average_jct() -> None:
    rng = np.random.default_rng(1)
    theirs = {f"j{i}": float(x) for i, x in enumerate(rng.uniform(100, 5000, 200))}
    ours = {k: v * 0.9 for k, v in theirs.items()}
    mean, lo, hi = protocol.paired_difference(ours, theirs)
    assert mean == pytest.approx(-0.10)
    assert lo < mean < hi
    # Every job 10% faster: the interval is narrow around -10%, far from 0.
    assert hi < -0.05
    # Same jobs, noise around no difference: the interval holds 0.
    noisy = {k: v + float(rng.normal(0, 300)) for k, v in theirs.items()}
    _, lo, hi = protocol.paired_difference(noisy, theirs)
    assert lo < 0 < hi
    with pytest.raises(ValueError, match="not finished"):
        protocol.paired_difference({"j0": 1.0}, theirs)


def test_pooled_difference_weighs_workloads_by_their_averages() -> None:
    a = {"x": 100.0, "y": 300.0}  # average 200
    b = {"x": 1000.0, "y": 3000.0}  # average 2000
    pairs = [({k: v - 20 for k, v in a.items()}, a), ({k: v + 200 for k, v in b.items()}, b)]
    mean, lo, hi = protocol.pooled_difference(pairs)
    # (-20 + 200) / 2 over (200 + 2000) / 2
    assert mean == pytest.approx(180 / 2200)
    assert lo == pytest.approx(mean)
    assert hi == pytest.approx(mean)


def test_the_table_sets_every_policy_beside_pollux(tmp_path: Path) -> None:
    theirs = protocol.pollux_jcts()[6]

    def run(scale: float) -> dict[str, object]:
        jobs = {k: v * scale for k, v in theirs.items()}
        return {
            "avg_jct_s": float(np.mean(list(jobs.values()))),
            "avg_jct_ci95": [0.0, 0.0],
            "jct_by_job": jobs,
            "per_app": {},
        }

    policies = {name: run(1.5) for name in protocol.BASELINES}
    policies["goodput"] = run(0.95)
    (tmp_path / "baselines-6.json").write_text(
        json.dumps({"workload": 6, "pollux_s": 2446, "policies": policies})
    )
    fold = {
        "held_out": 6,
        "seed": 0,
        "learned": run(0.9),
        "selection": {"imitation": {"mean": 2600.0}, "ppo": {"mean": 2700.0}},
        "chosen": "imitation",
        "training": {
            "imitation_samples": 7000,
            "ppo_iterations": 10,
            "ppo_env_steps": 20480.0,
            "wall_s": 231.0,
        },
    }
    (tmp_path / "fold-6-seed-0.json").write_text(json.dumps(fold))
    text = protocol.table(tmp_path)
    assert "learned policy below Pollux on 1 of 1 held-out workloads" in text
    row = next(line for line in text.splitlines() if line.startswith("| 6 | 2,446"))
    assert f"**{2446.13 * 0.9:,.0f}**" in row
    paired = [line for line in text.splitlines() if line.startswith("| 6 | -10.0%")]
    assert len(paired) == 1
    assert "-5.0%" in paired[0]
    assert "| 6 | 0 | 7,000 | 10 | 20,480 | 231 | 2,600 / 2,700 | imitation |" in text


def test_a_workload_above_pollux_is_attributed_to_its_applications(tmp_path: Path) -> None:
    """The learned policy 10% slower than Pollux on cifar10's jobs only: the whole gap is
    cifar10's, its share is the average JCT's difference."""
    theirs = protocol.pollux_jcts()[6]
    jobs = {k: v * 1.1 if k.startswith("cifar10") else v for k, v in theirs.items()}
    per_app = {
        app: {"jobs": 1, "jct_s": 1.0, "wait_s": 0.0, "gpus": 1.0}
        for app in {k.rsplit("-", 1)[0] for k in theirs}
    }
    run = {
        "avg_jct_s": float(np.mean(list(jobs.values()))),
        "avg_jct_ci95": [0.0, 0.0],
        "jct_by_job": jobs,
        "per_app": per_app,
    }
    base = {"goodput": run, "goodput-size": run, "oracle": run}
    text = "\n".join(protocol._attribution({6: [{"learned": run}]}, {6: {"policies": base}}))
    gap = run["avg_jct_s"] - float(np.mean(list(theirs.values())))
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| application", "|---"))
    }
    assert len(rows) == 6
    assert rows["cifar10"].endswith(f"| {gap:+,.0f} |")
    assert all(line.endswith("| +0 |") for app, line in rows.items() if app != "cifar10")


def test_the_ablation_sets_variants_beside_their_teachers(tmp_path: Path) -> None:
    """Two variants of training, each its own protocol folder: per variant the held-out
    mean (seeds averaged per workload) against the teachers the folds chose."""
    grid = {"0.5,-0.25": {"3": 2000.0, "6": 3000.0}, "0.0,-1.0": {"3": 9.0, "6": 9.0}}

    theirs = {3: 2000.0, 6: 3000.0}

    def write(out: Path, jcts: dict[int, list[float]], chosen: str) -> None:
        out.mkdir()
        (out / "teacher-grid.json").write_text(json.dumps(grid))
        for w, values in jcts.items():
            for seed, value in enumerate(values):
                row = {
                    "held_out": w,
                    "seed": seed,
                    "teacher_exponent": 0.5,
                    "fairness_p": -0.25,
                    "chosen": chosen,
                    "learned": {"avg_jct_s": value},
                    "candidates": {"imitation": {"avg_jct_s": theirs[w]}},
                    "training": {"ppo_env_steps": 61440.0, "wall_s": 700.0},
                }
                (out / f"fold-{w}-seed-{seed}.json").write_text(json.dumps(row))

    write(tmp_path / "residual", {3: [1900.0, 1940.0], 6: [3000.0]}, "ppo-20")
    write(tmp_path / "scratch", {3: [2200.0], 6: [3300.0]}, "ppo")
    text = protocol.ablation({"residual": tmp_path / "residual", "scratch": tmp_path / "scratch"})
    residual = next(line for line in text.splitlines() if line.startswith("| residual"))
    # (1920 + 3000) / 2 against (2000 + 3000) / 2: -1.6%, below on one of two.
    assert "| 2,460 | 2,500 | -1.60% | 1 of 2 | ppo-20 x3 | 61,440 | 700 |" in residual
    # The imitation-only checkpoint of every fold, as if selection had picked it.
    alone = next(line for line in text.splitlines() if "residual: `imitation` alone" in line)
    assert "| 2,500 | 2,500 | +0.00% | 0 of 2 |" in alone
    scratch = next(line for line in text.splitlines() if line.startswith("| scratch |"))
    assert "| 2,750 | 2,500 | +10.00% | 0 of 2 |" in scratch


def test_selection_weighs_the_imitation_every_saved_iteration_and_the_last(
    tmp_path: Path,
) -> None:
    for name in ("warm_start", "iter_0010", "iter_0020", "final"):
        (tmp_path / name).mkdir()
    found = protocol.checkpoints(tmp_path, {"checkpoint": str(tmp_path / "final")})
    assert found == {
        "imitation": tmp_path / "warm_start",
        "ppo-10": tmp_path / "iter_0010",
        "ppo-20": tmp_path / "iter_0020",
        "ppo": tmp_path / "final",
    }
    assert "imitation" not in protocol.checkpoints(tmp_path, {"checkpoint": "x"}, imitate=False)
