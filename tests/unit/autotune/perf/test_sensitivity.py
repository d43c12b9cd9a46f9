"""Compression sensitivity over jobs (``autotune.perf.sensitivity``): fitted to the
efficiencies measured on real tasks, drawn per job by the simulated cluster, which trains
each job at its draw while its snapshots keep the price the daemon knows."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import next_snapshot

from autotune.benchmarks import sensitivity as sensitivity_bench
from autotune.benchmarks import sensitivity_worlds
from autotune.catalog.tasks import BUILTIN_TASKS, resolve_task
from autotune.core import CompressionSensitivity, CompressionSpec, JobSpec, ModelProfile
from autotune.decision.step import decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.errors import InputError
from autotune.interfaces import JobSubmission
from autotune.perf.model import CATALOG_SENSITIVITY, compression_efficiency
from autotune.perf.sensitivity import (
    PenaltySpread,
    SensitivitySpread,
    fit,
    load,
    measured_spread,
    task_sensitivity,
)
from autotune.policies.rules import RulesPolicy

MEASURED = ("topk:0.1", "topk:0.01", "powersgd:1", "powersgd:2", "powersgd:4", "int8")


def _profile(sensitivity: CompressionSensitivity | None) -> ModelProfile:
    return ModelProfile(
        name="m",
        parameters=1,
        flops_per_sample=1.0,
        activation_bytes_per_sample=0.0,
        num_layers=1,
        compression_sensitivity=sensitivity,
    )


def test_a_models_sensitivity_prices_its_compressions_and_the_catalogs_when_it_has_none() -> None:
    topk, rank2 = CompressionSpec.parse("topk:0.01"), CompressionSpec.parse("powersgd:2")
    catalog = _profile(None)
    assert compression_efficiency(topk, catalog) == pytest.approx(1 - CATALOG_SENSITIVITY.topk * 4)
    assert compression_efficiency(rank2, catalog) == 1.0  # the catalog: PowerSGD is free
    assert compression_efficiency(CompressionSpec.parse("powersgd:1")) == 1.0
    sensitive = _profile(CompressionSensitivity(topk=0.1, powersgd=0.05))
    assert compression_efficiency(topk, sensitive) == pytest.approx(0.6)
    assert compression_efficiency(rank2, sensitive) == pytest.approx(0.9)
    # A measured efficiency still wins, and no price goes below the floor.
    measured = replace(sensitive, compression_efficiency=(("topk:0.01", 0.75),))
    assert compression_efficiency(topk, measured) == 0.75
    assert compression_efficiency(topk, _profile(CompressionSensitivity(topk=5, powersgd=0))) == 0.1
    with pytest.raises(ValueError, match="topk"):
        CompressionSensitivity(topk=-0.1, powersgd=0.0)


def test_a_tasks_sensitivity_is_what_its_measured_efficiencies_fit() -> None:
    truth = _profile(CompressionSensitivity(topk=0.07, powersgd=0.03))
    found = {n: compression_efficiency(CompressionSpec.parse(n), truth) for n in MEASURED}
    fitted = task_sensitivity(found)
    assert fitted is not None
    assert (fitted.topk, fitted.powersgd) == (pytest.approx(0.07), pytest.approx(0.03))
    # Faster than dense SGD is no loss; a task with no top-k or PowerSGD run fits nothing.
    assert task_sensitivity({"topk:0.01": 2.2, "powersgd:4": 1.0}) == CompressionSensitivity(
        topk=0.0, powersgd=0.0
    )
    assert task_sensitivity({"int8": 1.0}) is None


def test_the_spread_over_tasks_draws_what_it_was_fitted_to() -> None:
    values = [0.0, 0.02, 0.05, 0.2]
    part = PenaltySpread.of(values)
    assert part.pays_nothing == 0.25
    logs = [math.log(v) for v in values[1:]]
    assert part.log_mean == pytest.approx(np.mean(logs))
    assert part.log_sd == pytest.approx(np.std(logs, ddof=1))
    rng = np.random.default_rng(0)
    draws = np.array([part.draw(rng) for _ in range(20_000)])
    assert np.mean(draws == 0) == pytest.approx(0.25, abs=0.01)
    assert np.median(np.log(draws[draws > 0])) == pytest.approx(part.log_mean, abs=0.03)
    assert part.cdf(0.0) == 0.25
    assert part.cdf(part.median) == pytest.approx(0.5)
    assert np.mean(draws <= part.median) == pytest.approx(0.5, abs=0.01)


def test_the_shipped_measurement_fits_every_builtin_task_it_holds() -> None:
    spread, data = load()
    assert spread == measured_spread()
    assert set(data["tasks"]) <= set(BUILTIN_TASKS)
    assert len(spread.tasks) == len(data["tasks"]) >= 4
    refit = fit({t: f["compression_efficiency"] for t, f in data["tasks"].items()})
    assert refit == spread
    for part in (spread.topk, spread.powersgd):
        assert 0 <= part.pays_nothing < 1  # some task pays for each kind


def _jobs(spread: SensitivitySpread | None) -> SimulatedCluster:
    """Eight jobs on a cluster, placed by the rules and moved to top-k 1%, one round run."""
    cluster = SimulatedCluster(
        SimConfig(seed=3, initial_jobs=0, max_jobs=0, noise=False, sensitivity=spread)
    )
    model = resolve_task("gpt-125m", ()).model
    assert model is not None
    assert not model.compression_efficiency
    for i in range(8):
        spec = JobSpec(job_id=f"j{i}", model=model, min_gpus=2, max_gpus=2)
        cluster.submit(JobSubmission(spec=spec, task="gpt-125m", steps=10**8))
    snapshot = next_snapshot(cluster)
    topk = CompressionSpec.parse("topk:0.01")
    decisions = decide_for(snapshot, RulesPolicy(), {}, honoured={}).decisions
    cluster.apply(
        [replace(d, config=replace(d.config, compression=topk)) for d in decisions if d.placement]
    )
    cluster.run_round()
    cluster.run_round()
    return cluster


def test_the_simulated_cluster_trains_each_job_at_its_drawn_sensitivity() -> None:
    spread = SensitivitySpread(
        topk=PenaltySpread(pays_nothing=0.25, log_mean=math.log(0.08), log_sd=0.8),
        powersgd=PenaltySpread(pays_nothing=0.0, log_mean=math.log(0.1), log_sd=0.5),
    )
    drawn, catalog = _jobs(spread), _jobs(None)
    topk = CompressionSpec.parse("topk:0.01")
    ratios = []
    for job_id, job in drawn.jobs.items():
        same = catalog.jobs[job_id]
        assert same.truth is None
        assert job.truth is not None
        assert job.truth.compression_sensitivity is not None
        # The daemon sees the profile it knows; the job trains at its draw.
        assert job.status.spec.model == same.status.spec.model
        assert job.status.spec.model.compression_sensitivity is None  # type: ignore[union-attr]
        if same.done > 0:
            ratios.append((job.done / same.done, compression_efficiency(topk, job.truth) / 0.84))
    assert len(ratios) >= 4
    for got, want in ratios:
        assert got == pytest.approx(want, rel=1e-6)
    assert len({round(want, 6) for _, want in ratios}) > 1  # the jobs differ
    # The same seed draws the same jobs.
    again = _jobs(spread)
    assert [j.truth for j in again.jobs.values()] == [j.truth for j in drawn.jobs.values()]


def test_a_task_whose_efficiencies_were_measured_trains_at_them() -> None:
    spread = measured_spread()
    cluster = SimulatedCluster(SimConfig(seed=0, initial_jobs=0, max_jobs=0, sensitivity=spread))
    model = resolve_task("gpt-125m", ()).model
    assert model is not None
    known = model.with_compression_efficiency({"topk:0.01": 0.5})
    cluster.submit(JobSubmission(spec=JobSpec(job_id="k", model=known), task="gpt-125m", steps=9))
    cluster.submit(JobSubmission(spec=JobSpec(job_id="u", model=model), task="gpt-125m", steps=9))
    next_snapshot(cluster)
    assert cluster.jobs["k"].truth is None
    assert cluster.jobs["u"].truth is not None


def test_the_fit_benchmark_recovers_the_tasks_and_writes_a_file_that_loads(
    tmp_path: Path,
) -> None:
    """From steps-to-target rows (``bench/quality_validation.py``'s) of two tasks whose
    efficiencies follow known sensitivities, the benchmark finds them, and what it writes
    loads as the spread it reports."""
    truths = {
        "mlp-synthetic": CompressionSensitivity(topk=0.05, powersgd=0.12),
        "resnet-mini": CompressionSensitivity(topk=0.2, powersgd=0.0),
    }
    rows = [
        {
            "task": task,
            "seed": seed,
            "setting": setting,
            "efficiency": compression_efficiency(CompressionSpec.parse(setting), _profile(truth))
            * (1 + 0.01 * (seed - 1)),  # seeds scattered about the truth: their median
        }
        for task, truth in truths.items()
        for seed in (0, 1, 2)
        for setting in MEASURED
    ] + [{"task": "mlp-synthetic", "seed": 0, "setting": "precision=bf16", "efficiency": 0.99}]
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"n_steps": 150, "dp": 2, "limit_steps": 300, "rows": rows}))
    out, written = tmp_path / "fit.json", tmp_path / "sensitivity.json"
    argv = [str(runs), "--out", str(out), "--write", str(written)]
    assert sensitivity_bench.main(argv) == 0
    report = json.loads(out.read_text())
    for task, truth in truths.items():
        found = report["tasks"][task]["sensitivity"]
        assert found["topk"] == pytest.approx(truth.topk, abs=1e-4)
        assert found["powersgd"] == pytest.approx(truth.powersgd, abs=1e-4)
        assert report["tasks"][task]["held_out_cdf"] is not None
    assert report["spread"]["powersgd"]["pays_nothing"] == 0.5
    assert report["absolute_error"]["shapes"]["mean"] < 1e-3  # the shapes are the truth
    assert report["absolute_error"]["catalog"]["mean"] > 0.05
    spread, data = load(written)
    assert data["tasks"]["mlp-synthetic"]["precision_efficiency"] == {"bf16": 0.99}
    assert spread.topk.log_mean == pytest.approx(report["spread"]["topk"]["log_mean"], abs=1e-3)
    with pytest.raises(InputError, match="sensitivity file"):
        load(tmp_path / "missing.json")


@pytest.mark.slow
def test_the_worlds_benchmark_plays_each_policy_at_the_catalogs_price_and_at_drawn_ones(
    tmp_path: Path,
) -> None:
    out = tmp_path / "worlds.json"
    argv = ["--jobs", "6", "--seeds", "1", "--policies", "rules", "--out", str(out)]
    assert sensitivity_worlds.main(argv) == 0
    worlds = json.loads(out.read_text())["worlds"]
    assert set(worlds) == {"catalog", "drawn"}
    for world in worlds.values():
        row = world["rules"]
        assert row["n_jobs_done"] == 6
        assert sum(row["gpu_time_share"].values()) == pytest.approx(1.0, abs=1e-3)
