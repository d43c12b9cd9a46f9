"""Calibration: the fit recovers a machine it measured, and ``autotune calibrate`` runs
its grid for real and saves a profile the performance model loads."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from helpers import autotune_command

from autotune.catalog.devices import DeviceSpec, device
from autotune.catalog.tasks import BUILTIN_TASKS
from autotune.core import CompressionSpec, JobConfig, Layout, ModelProfile, PrecisionMap
from autotune.executor.calibrate import (
    BATCH,
    GRID,
    LARGE_BATCH,
    LINK_FREE,
    TP_LATENCY,
    Measurement,
    _device,
    _predict,
    compute_grid,
    fit_compute,
    fit_profile,
    link_free,
    link_grid,
    load_profile,
    step_of,
    task_statistics,
)
from autotune.perf.model import Coefficients, Shape


def test_grid_spans_layouts_compression_and_precision() -> None:
    assert len(GRID) >= 12
    assert {(c.layout.dp, c.layout.tp, c.layout.pp) for c in GRID} == {
        (1, 1, 1),
        (2, 1, 1),
        (1, 2, 1),
        (1, 1, 2),
    }
    assert {c.compression.kind for c in GRID} == {"none", "topk", "int8"}
    assert {c.precision.ffn for c in GRID} == {"fp32", "bf16"}


def test_the_task_statistics_are_the_median_noise_scale_of_the_runs_that_measured_one() -> None:
    rows = [
        Measurement(GRID[0], 1.0, 0),  # one replica: no noise scale
        Measurement(GRID[2], 1.0, 0, noise_scale=180.0),
        Measurement(GRID[3], 1.0, 0, noise_scale=260.0),
        Measurement(GRID[4], 1.0, 0, noise_scale=200.0),
    ]
    found = task_statistics(rows)
    assert found == {
        "gpt-char": {
            "noise_scale": 200.0,
            "global_batch": BUILTIN_TASKS["gpt-char"].shape.batch_size,  # type: ignore[union-attr]
            "measured_in": [GRID[i].describe() for i in (2, 3, 4)],
        }
    }
    assert task_statistics(rows[:1]) == {}


def test_fit_recovers_step_times_of_a_known_machine() -> None:
    profile = BUILTIN_TASKS["gpt-char"].profile
    base = device("CPU")
    truth_spec = _device(base, 0.05, 0.6)
    truth = Coefficients(
        mfu=1.0,
        compute_overhead_s=0.02,
        intra_latency_s=2e-4,
        intra_bw_efficiency=0.02,
        overlap_gamma=1.3,
    )
    rows = [Measurement(c, 1.0, 0) for c in GRID]
    times = _predict(profile, rows, truth_spec, truth)
    rng = np.random.default_rng(0)
    noisy = [
        Measurement(c, float(t * rng.uniform(0.97, 1.03)), 0)
        for c, t in zip(GRID, times, strict=True)
    ]
    spec, coeffs = fit_profile(profile, noisy, base)
    fitted = _predict(profile, noisy, spec, coeffs)
    assert np.mean(np.abs(fitted - times) / times) < 0.05
    assert spec.peak_tflops["bf16"] / spec.peak_tflops["fp32"] == pytest.approx(0.6, rel=0.1)


def test_machines_on_a_network_are_fitted_from_steps_and_their_unhidden_sync() -> None:
    # Two machines of one rank each on a 100 Mbit/s link: six configurations measured
    # (step and the synchronisation no rank hid) predict the others' steps.
    profile = BUILTIN_TASKS["gpt-char"].profile
    base = device("CPU")
    shape = Shape(gpu_model="CPU", ranks_per_node=(1, 1), inter_node_gbps=0.0125)
    truth_spec = _device(base, 0.02, 0.8)
    truth = Coefficients(
        mfu=1.0, compute_overhead_s=0.05, inter_latency_s=5e-3, inter_bw_efficiency=0.85,
        overlap_gamma=1.6,
    )  # fmt: skip
    configs = [
        JobConfig(layout=Layout(world_size=2, dp=2), compression=c, precision=p)
        for c in (
            CompressionSpec(),
            CompressionSpec(kind="topk", ratio=0.01),
            CompressionSpec(kind="int8"),
            CompressionSpec(kind="powersgd", rank=4),
        )
        for p in (PrecisionMap.uniform("fp32"), PrecisionMap.uniform("bf16"))
    ]
    truths = [
        step_of(profile, Measurement(c, 1.0, 0, shape=shape, batch=64), truth_spec, truth)
        for c in configs
    ]
    rows = [
        Measurement(c, t.step_s, 0, shape=shape, batch=64, sync_s=t.step_s - t.compute_s)
        for c, t in zip(configs, truths, strict=True)
    ]
    spec, coeffs = fit_profile(profile, rows[:6], base, LINK_FREE)
    for row, t in zip(rows[6:], truths[6:], strict=True):
        assert step_of(profile, row, spec, coeffs).step_s == pytest.approx(t.step_s, rel=0.05)


def _modelled(
    profile: ModelProfile,
    config: JobConfig,
    batch: int,
    shape: Shape,
    spec: DeviceSpec,
    truth: Coefficients,
) -> Measurement:
    """A run of ``config`` as the model with ``truth`` says it goes: its step and the
    synchronisation no rank hid."""
    t = step_of(profile, Measurement(config, 1.0, 0, shape=shape, batch=batch), spec, truth)
    return Measurement(config, t.step_s, 0, shape=shape, batch=batch, sync_s=t.step_s - t.compute_s)


def test_the_link_grid_tells_compute_from_overhead_and_a_tensor_parallel_collective_apart() -> None:
    """Four machines of one rank each, six runs: the dense run at a 4x batch tells a
    per-step overhead from a per-sample compute, the run in bf16 under top-k tells the
    device's 16-bit speed (its compute) from top-k's reduction (its synchronisation),
    and the tensor-parallel pair across machines its activation all-reduces' own cost.
    The fit then prices other batches, bf16 and top-k each alone, and tensor
    parallelism, as the machines run them; without the tensor-parallel run, the
    data-parallel reduction's latency prices those collectives (what the model did
    before), far off."""
    grid = link_grid(4)
    assert len(grid) == 6, "at most six configurations"
    assert [c.global_batch for c in grid].count(LARGE_BATCH) == 1
    assert all(c.executor_refusal() is None for c in grid)
    assert [(c.layout.dp, c.layout.tp) for c in grid].count((2, 2)) == 1
    profile = BUILTIN_TASKS["gpt-char"].profile
    base = device("CPU")
    shape = Shape(gpu_model="CPU", ranks_per_node=(1,) * 4, inter_node_gbps=0.118)
    truth_spec = _device(base, 0.01, 0.7)
    truth = Coefficients(
        mfu=1.0, compute_overhead_s=0.04, inter_latency_s=9e-3, tp_latency_s=4e-3,
        inter_bw_efficiency=0.6, overlap_gamma=2.0, executor_reduction=True,
    )  # fmt: skip

    def measured(config: JobConfig, batch: int = BATCH) -> Measurement:
        return _modelled(profile, config, batch, shape, truth_spec, truth)

    rows = [measured(c, c.global_batch or BATCH) for c in grid]
    free = link_free(rows)
    assert TP_LATENCY in free
    assert link_free(rows[:5]) == LINK_FREE
    spec, coeffs = fit_profile(profile, rows, base, free)
    dense, tp = grid[0], grid[5]
    held_out = [
        replace(dense, precision=PrecisionMap.uniform("bf16")),
        replace(dense, compression=CompressionSpec(kind="topk", ratio=0.01)),
        replace(dense, compression=CompressionSpec(kind="topk", ratio=0.1)),
    ]
    for want in [measured(dense, 8), measured(dense, 128), *map(measured, held_out)]:
        got = step_of(profile, want, spec, coeffs).step_s
        assert got == pytest.approx(want.step_time_s, rel=0.05), want.config.describe()
    assert coeffs.compute_overhead_s == pytest.approx(truth.compute_overhead_s, rel=0.2)
    assert coeffs.tp_latency_s == pytest.approx(truth.tp_latency_s, rel=0.2)
    # The tensor-parallel run left out: its collectives priced at the data-parallel
    # reduction's latency.
    spec5, coeffs5 = fit_profile(profile, rows[:5], base, link_free(rows[:5]))
    assert coeffs5.tp_latency_s == 0
    without = step_of(profile, rows[5], spec5, coeffs5).step_s
    assert without > 1.3 * rows[5].step_time_s, tp.describe()


@pytest.mark.parametrize("task", ["mlp-synthetic", "resnet-mini"])
def test_a_tasks_own_compute_is_fitted_on_the_clusters_device_and_links(task: str) -> None:
    """A cluster calibrated on gpt-char (device, links, overlap), and a task whose speed
    per FLOP and per-step overhead are its own: its two plain-DDP runs (``compute_grid``)
    recover them, and the model then prices the task's other configurations and batches
    as it runs them, where the cluster's coefficients (gpt-char's overhead) do not."""
    grid = compute_grid(task, 4)
    batch = BUILTIN_TASKS[task].profile.reference_batch
    assert [c.global_batch for c in grid] == [None, 4 * batch]
    assert all(c.layout.dp == 4 and c.compression.kind == "none" for c in grid)
    profile = BUILTIN_TASKS[task].profile
    shape = Shape(gpu_model="CPU", ranks_per_node=(1,) * 4, inter_node_gbps=0.118)
    spec = _device(device("CPU"), 0.03, 0.7)
    cluster = Coefficients(
        mfu=1.0, compute_overhead_s=0.045, inter_latency_s=5e-3, inter_bw_efficiency=0.7,
        overlap_gamma=2.0, executor_reduction=True,
    )  # fmt: skip
    truth = cluster.fitted({"mfu": 0.3, "compute_overhead_s": 0.012, "inter_latency_s": 1e-3})

    def measured(config: JobConfig, batch: int) -> Measurement:
        return _modelled(profile, config, batch, shape, spec, truth)

    rows = [measured(c, c.global_batch or batch) for c in grid]
    fitted = fit_compute(profile, rows, spec, cluster)
    assert fitted.compute_overhead_s == pytest.approx(0.012, rel=0.1)
    assert fitted.inter_bw_efficiency == cluster.inter_bw_efficiency  # the cluster's
    assert fitted.overlap_gamma == cluster.overlap_gamma
    others = [
        replace(grid[0], compression=CompressionSpec(kind="topk", ratio=0.01)),
        replace(grid[0], compression=CompressionSpec(kind="powersgd", rank=4)),
        replace(grid[0], precision=PrecisionMap.uniform("bf16")),
    ]
    for config, b in [(c, batch) for c in others] + [(grid[0], 2 * batch)]:
        want = measured(config, b)
        assert step_of(profile, want, spec, fitted).step_s == pytest.approx(
            want.step_time_s, rel=0.05
        )
    # On the cluster's coefficients (gpt-char's compute) the task's step is off.
    first = rows[0]
    assert abs(step_of(profile, first, spec, cluster).step_s / first.step_time_s - 1) > 0.1


@pytest.mark.ray
@pytest.mark.subprocess
@pytest.mark.slow
def test_calibrate_command_measures_the_grid_and_saves_a_profile(tmp_path) -> None:
    out = tmp_path / "profile.json"
    done = subprocess.run(
        [*autotune_command(), "calibrate", "--steps", "2", "--out", str(out), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert len(report["configs"]) == len(GRID)
    assert all(row["measured_step_s"] > 0 for row in report["configs"])
    topk = next(r for r in report["configs"] if "topk" in r["config"])
    dense = next(r for r in report["configs"] if r["config"] == "dp=2 tp=1 pp=1, fp32, none")
    assert 0 < topk["bytes_sent"] < dense["bytes_sent"]
    assert 0 <= report["mape_step_time"] <= report["mape_step_time_held_out"] + 1.0
    # The noise scale of gpt-char, from the data-parallel runs that reported one.
    stats = report["statistics"]["gpt-char"]
    assert stats["noise_scale"] > 0
    assert stats["measured_in"]
    configs = {r["config"] for r in report["configs"]}
    assert all(name in configs and name.startswith("dp=2") for name in stats["measured_in"])
    spec, coeffs = load_profile(out)
    assert spec.peak_tflops["fp32"] == report["device"]["peak_tflops"]["fp32"]
    assert coeffs.compute_overhead_s == report["coefficients"]["compute_overhead_s"]
