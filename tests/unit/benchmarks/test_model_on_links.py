"""The model-on-links benchmark: fitted to some configurations it predicts the others;
given a calibrated cluster file it fits nothing and predicts with the model the daemon
uses there, the task's measured compression efficiencies included."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from autotune.benchmarks.model_on_links import run
from autotune.benchmarks.time_to_target import KNOBS, REFERENCE, job_config
from autotune.catalog import tasks
from autotune.catalog.clusters import (
    ClusterDescription,
    LinkMeasurement,
    calibration_profile,
    save_cluster,
)
from autotune.catalog.devices import node_info
from autotune.perf.model import DEFAULT_COEFFICIENTS, Shape, step_time

MACHINES = 4
BATCH = 64
GBPS = 0.118
LABELS = (REFERENCE, "topk-1%", "int8", "powersgd-4", "pp2")
REPORT: dict[str, Any] = {
    "task": "gpt-char",
    "device": {"name": "CPU-calibrated", "base": "CPU",
               "peak_tflops": {"fp32": 0.03, "bf16": 0.01}},
    "coefficients": {
        **asdict(DEFAULT_COEFFICIENTS),
        "inter_latency_s": 0.003, "inter_bw_efficiency": 0.8, "executor_reduction": True,
    },
    # The calibration measured plain DDP and top-k 1% of gpt-char.
    "configs": [{"config": job_config(MACHINES, "").describe()},
                {"config": job_config(MACHINES, KNOBS["topk-1%"]).describe()}],
    "statistics": {"mlp-synthetic": {"compression_efficiency": {"topk:0.01": 0.5}}},
    "mape_step_time": 0.05,
    "mape_step_time_held_out": 0.08,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a calibrated cluster file registers what it measured: forget it after."""
    from autotune.catalog import applications

    monkeypatch.setattr(tasks, "_MEASURED_NOISE", {})
    monkeypatch.setattr(tasks, "_MEASURED_COMPRESSION", {})
    monkeypatch.setattr(applications, "_CALIBRATED", {})
    monkeypatch.setattr(applications, "_CALIBRATED_TASKS", {})


def _cluster_file(tmp_path: Path, report: dict[str, Any] = REPORT) -> Path:
    nodes = tuple(
        node_info(f"m{i}", gpu_model="CPU", gpu_count=1, cpu_milli=1000, memory_mib=4096)
        for i in range(MACHINES)
    )
    links = tuple(
        LinkMeasurement(a="m0", b=f"m{i}", gbps=GBPS, latency_s=0.003, bytes=1 << 24)
        for i in range(1, MACHINES)
    )
    cluster = ClusterDescription(nodes=nodes, links=links).with_calibration(report)
    path = tmp_path / "cluster.json"
    save_cluster(cluster, path)
    return path


def _measured(
    task: str, steps: dict[str, int], compute: dict[str, float] | None = None
) -> dict[str, Any]:
    """Runs whose step times are the calibrated model's own, on the file's links (with
    the task's own ``compute`` coefficients, where given)."""
    spec, coeffs = calibration_profile(REPORT)
    coeffs = coeffs.fitted(compute or {})
    profile = tasks.BUILTIN_TASKS[task].profile
    shape = Shape(gpu_model=spec.name, ranks_per_node=(1,) * MACHINES, inter_node_gbps=GBPS)
    runs = []
    for label in LABELS:
        recipe = "" if label == REFERENCE else KNOBS[label]
        step = step_time(
            profile, job_config(MACHINES, recipe), shape, BATCH,
            coeffs=coeffs, spec=spec,
        )  # fmt: skip
        runs.append(
            {
                "config": label,
                "recipe": recipe,
                "seed": 0,
                "step_time_s_median": step.step_s,
                "communication_share": None,
                "steps": steps.get(label, 100),
                "reached": True,
            }
        )
    runs.append({"config": "learned (daemon)", "seed": 0, "steps": 50})  # not a fixed one
    return {
        "task": task,
        "machines": MACHINES,
        "mbit": 1000,
        "global_batch": BATCH,
        "runs": runs,
    }


def test_a_calibrated_cluster_file_predicts_without_fitting(tmp_path: Path) -> None:
    path = _cluster_file(tmp_path)

    # The calibration's own task: what it measured is not held out, the rest is.
    result = run(_measured("gpt-char", {}), [], path)
    rows = {r["config"]: r for r in result["configs"]}
    assert set(rows) == set(LABELS), "the daemon's runs are not configurations"
    assert result["calibrated_from"] == [REFERENCE, "topk-1%"]
    assert [c for c, r in rows.items() if r["held_out"]] == ["int8", "powersgd-4", "pp2"]
    for r in rows.values():
        assert r["step_error"] == pytest.approx(0.0, abs=1e-3)
    assert result["held_out_step_error_worst"] == pytest.approx(0.0, abs=1e-3)
    assert result["cluster_file"] == str(path)

    # Another task: every configuration is held out, and its steps to the target come
    # from the efficiency the calibration measured of it (top-k 1%: half of dense).
    result = run(_measured("mlp-synthetic", {"topk-1%": 200}), [], path)
    rows = {r["config"]: r for r in result["configs"]}
    assert all(r["held_out"] for r in rows.values())
    assert rows["topk-1%"]["predicted_steps"] == pytest.approx(200.0)
    assert rows["topk-1%"]["steps_error"] == pytest.approx(0.0)


def test_a_tasks_own_compute_prices_its_runs_and_its_plain_ddp_is_in_sample(
    tmp_path: Path,
) -> None:
    """A calibration that fitted mlp-synthetic's compute (``calibrate --compute``): the
    task's runs are predicted with it, its plain DDP (a compute run) is in sample, the
    rest held out; on the cluster's coefficients alone the same runs are off."""
    own = {"mfu": 0.4, "compute_overhead_s": 0.01}
    ddp = job_config(MACHINES, "").describe()
    report = {
        **REPORT,
        "statistics": {
            "mlp-synthetic": {"compute": {"coefficients": own, "configs": [{"config": ddp}]}}
        },
    }
    measured = _measured("mlp-synthetic", {}, own)
    result = run(measured, [], _cluster_file(tmp_path, report))
    assert result["calibrated_from"] == [REFERENCE]
    rows = {r["config"]: r for r in result["configs"]}
    assert [c for c, r in rows.items() if not r["held_out"]] == [REFERENCE]
    assert result["held_out_step_error_worst"] == pytest.approx(0.0, abs=1e-3)
    plain = run(measured, [], _cluster_file(tmp_path / "plain", REPORT))
    assert plain["held_out_step_error_worst"] > 0.1


def test_the_cluster_file_must_be_calibrated_and_of_the_runs_machines(tmp_path: Path) -> None:
    nodes = tuple(
        node_info(f"m{i}", gpu_model="CPU", gpu_count=1, cpu_milli=1000, memory_mib=4096)
        for i in range(MACHINES)
    )
    bare = tmp_path / "bare.json"
    save_cluster(ClusterDescription(nodes=nodes), bare)
    with pytest.raises(SystemExit, match="not calibrated"):
        run(_measured("gpt-char", {}), [], bare)
    measured = {**_measured("gpt-char", {}), "machines": 2}
    with pytest.raises(SystemExit, match="has 4 machines; the runs had 2"):
        run(measured, [], _cluster_file(tmp_path))


def test_fitted_to_some_configurations_it_predicts_the_others() -> None:
    result = run(_measured("gpt-char", {}), [REFERENCE, "topk-1%", "int8", "powersgd-4"])
    assert result["cluster_file"] is None
    rows = {r["config"]: r for r in result["configs"]}
    assert [c for c, r in rows.items() if r["held_out"]] == ["pp2"]
    # The runs are a model's own: the fit finds a model as good on what it was given.
    assert result["coefficients"]
    for label in (REFERENCE, "topk-1%", "int8", "powersgd-4"):
        assert abs(rows[label]["step_error"]) < 0.05
