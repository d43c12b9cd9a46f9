"""A calibrated cluster file: ``autotune calibrate --cluster-file`` writes its report into
the file; loading the file registers the calibrated device, whose measured figures the
simulated cluster, the observation and the Ray backend then use; ``train-policy
--cluster-file`` trains on the file's nodes with a stream of its users' tasks."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import cli

from autotune.catalog.applications import APPLICATION_PROFILES, catalog_coefficients
from autotune.catalog.clusters import (
    ClusterDescription,
    LinkMeasurement,
    calibration_profile,
    load_cluster,
    save_cluster,
)
from autotune.catalog.devices import device, node_info, register_device
from autotune.catalog.tasks import BUILTIN_TASKS
from autotune.core import (
    MAX_COMPRESSION_EFFICIENCY,
    JobConfig,
    Layout,
    Placement,
    PrecisionMap,
    RankSlot,
)
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.envs.workloads import job_stream, task_mix
from autotune.errors import InputError
from autotune.perf.model import DEFAULT_COEFFICIENTS, Shape, estimate

COEFFICIENTS = {
    "mfu": 1.0,
    "compute_overhead_s": 0.02,
    "intra_latency_s": 1e-05,
    "inter_latency_s": 0.003,
    "intra_bw_efficiency": 0.7,
    "inter_bw_efficiency": 0.8,
    "node_sharing_exponent": 1.0,
    "overlap_gamma": 1.2,
    "tree_latency_s": 0.0,
    "two_node_sync_factor": 1.0,
    "batch_exponent": 1.0,
}
# A CPU whose bf16 is a third of its fp32, where the catalog's CPU assumes no fast bf16
# (emulated at half its fp32).
REPORT = {
    "task": "gpt-char",
    "device": {"name": "CPU-calibrated", "base": "CPU",
               "peak_tflops": {"fp32": 0.03, "bf16": 0.01}},
    "coefficients": COEFFICIENTS,
    "configs": [],
    "mape_step_time": 0.05,
    "mape_step_time_held_out": 0.08,
}  # fmt: skip


def _cluster(machines: int = 2) -> ClusterDescription:
    nodes = tuple(
        node_info(
            f"m{i}",
            gpu_model="CPU",
            gpu_count=1,
            cpu_milli=1000,
            memory_mib=4096,
            backend_node_id=f"ray-{i}",
        )
        for i in range(machines)
    )
    links = tuple(
        LinkMeasurement(a="m0", b=f"m{i}", gbps=0.0119, latency_s=0.0029, bytes=1 << 24)
        for i in range(1, machines)
    )
    return ClusterDescription(nodes=nodes, links=links, source="ray://198.18.0.1:6379")


def test_a_calibration_switches_the_nodes_to_the_calibrated_device_and_round_trips(
    tmp_path: Path,
) -> None:
    calibrated = _cluster().with_calibration(REPORT)
    assert {n.gpu_model for n in calibrated.nodes} == {"CPU-calibrated"}
    assert calibrated.nodes[0].peak_tflops == {"fp32": 0.03, "bf16": 0.01}
    save_cluster(calibrated, tmp_path / "cluster.json")
    loaded = load_cluster(tmp_path / "cluster.json")
    assert loaded == calibrated
    spec = device("CPU-calibrated")
    assert dict(spec.peak_tflops) == {"fp32": 0.03, "bf16": 0.01}
    assert spec.memory_gib == device("CPU").memory_gib  # the rest is the base's
    assert loaded.coefficients is not None
    assert loaded.coefficients.inter_latency_s == 0.003
    # Every job on the calibrated device predicts from the calibration (the decision
    # step, the restart check, the daemon's online fits start there), an application
    # too; elsewhere the catalog's coefficients stand.
    gpt = BUILTIN_TASKS["gpt-char"].profile
    assert catalog_coefficients(gpt, "CPU-calibrated") == loaded.coefficients
    assert catalog_coefficients(APPLICATION_PROFILES["bert"], "CPU-calibrated") == (
        loaded.coefficients
    )
    assert catalog_coefficients(gpt, "CPU") == DEFAULT_COEFFICIENTS
    # Calibrating again replaces the calibration, and keeps the nodes on the device.
    again = loaded.with_calibration({**REPORT, "mape_step_time": 0.04})
    assert {n.gpu_model for n in again.nodes} == {"CPU-calibrated"}
    assert again.calibration is not None
    assert again.calibration["mape_step_time"] == 0.04


def test_a_catalog_name_cannot_be_replaced_and_a_bad_calibration_is_named(
    tmp_path: Path,
) -> None:
    spec, _ = calibration_profile(REPORT)
    with pytest.raises(ValueError, match="catalog device"):
        register_device(replace(spec, name="CPU"))
    data = _cluster().with_calibration(REPORT).to_json()
    data["calibration"]["device"]["base"] = "no-such-gpu"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="calibration"):
        load_cluster(path)


def test_the_simulated_cluster_runs_jobs_on_the_calibrated_figures(tmp_path: Path) -> None:
    save_cluster(_cluster().with_calibration(REPORT), tmp_path / "cluster.json")
    cluster = load_cluster(tmp_path / "cluster.json")
    sim = SimulatedCluster(
        SimConfig(nodes=cluster.nodes, coeffs=cluster.coefficients, initial_jobs=2, max_jobs=2)
    )
    snapshot = sim.observe()
    assert {n.gpu_model for n in snapshot.nodes} == {"CPU-calibrated"}
    job = snapshot.jobs[0]
    assert sim.coefficients(job.spec.job_id) == cluster.coefficients
    shape = Shape(gpu_model="CPU-calibrated", ranks_per_node=(1, 1), inter_node_gbps=0.0119)
    fp32 = JobConfig(layout=Layout(world_size=2))
    bf16 = replace(fp32, precision=PrecisionMap.uniform("bf16"))
    step = {
        name: sim.estimate_for(job.spec.job_id, config, shape).step.step_s
        for name, config in (("fp32", fp32), ("bf16", bf16))
    }
    # Measured: bf16 at a third of fp32; the catalog's CPU emulates it at half.
    assert step["bf16"] > step["fp32"]
    assert job.spec.model is not None
    catalog = {
        name: estimate(
            job.spec.model, config, replace(shape, gpu_model="CPU"), config.batch(job.spec)
        ).step.step_s
        for name, config in (("fp32", fp32), ("bf16", bf16))
    }
    assert step["bf16"] / step["fp32"] > catalog["bf16"] / catalog["fp32"] > 1


def test_a_task_mix_streams_the_users_tasks_at_their_own_batch() -> None:
    mix, batches = task_mix(["gpt-char", "mlp-synthetic", "gpt-char"], 4)
    assert [m[0] for m in mix] == ["gpt-char", "mlp-synthetic"]
    assert all(m[2:] == (1, 4) for m in mix)
    gpt = BUILTIN_TASKS["gpt-char"].shape
    assert batches["gpt-char"] == gpt.batch_size  # type: ignore[union-attr]
    _spec, coeffs = calibration_profile(REPORT)
    jobs = list(
        job_stream(
            np.random.default_rng(0),
            mean_interarrival_s=60,
            initial_jobs=3,
            max_jobs=12,
            mix=mix,
            batches=batches,
            coeffs=coeffs,
        )
    )
    assert {j.task for j in jobs} == {"gpt-char", "mlp-synthetic"}
    for j in jobs:
        assert j.spec.global_batch == batches[str(j.task)]
        assert j.work == j.steps * j.spec.global_batch  # type: ignore[operator]
        assert j.coeffs == coeffs
        assert 1 <= j.spec.min_gpus <= j.spec.max_gpus == 4
    with pytest.raises(ValueError, match="unknown task"):
        task_mix(["no-such-task"], 4)
    # A job's devices: exactly N, or a range, within the cluster's.
    mix, _ = task_mix(["gpt-char:4", "mlp-synthetic:2-3"], 4)
    assert mix == (("gpt-char", 1.0, 4, 4), ("mlp-synthetic", 1.0, 2, 3))
    for bad in ("gpt-char:5", "gpt-char:3-2", "gpt-char:x", "gpt-char:0"):
        with pytest.raises(ValueError, match="GPUs"):
            task_mix([bad], 4)


def test_training_episodes_play_the_described_cluster(tmp_path: Path) -> None:
    from autotune.policies.ppo import make_train_env
    from autotune.policies.ppo_settings import PPOSettings, TraceSource

    save_cluster(_cluster(4).with_calibration(REPORT), tmp_path / "cluster.json")
    source = TraceSource(
        kind="cluster",
        jobs="gpt-char,mlp-synthetic",
        nodes=str(tmp_path / "cluster.json"),
        window=6,
        round_s=60.0,
    )
    settings = PPOSettings(sources=(source,), slots=4, max_steps=8, forecast=False)
    env = make_train_env(asdict(settings))
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    sim: Any = env.current.sim
    assert {n.gpu_model for n in sim.nodes} == {"CPU-calibrated"}
    assert {j.arrival.task for j in sim.jobs.values()} <= {"gpt-char", "mlp-synthetic"}
    assert all(j.arrival.coeffs.inter_latency_s == 0.003 for j in sim.jobs.values())
    for _ in range(3):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert np.isfinite(reward)
        if terminated or truncated:
            break


def test_a_tasks_own_compute_prices_its_jobs_wherever_the_cluster_is_modelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A calibration that also fitted mlp-synthetic's compute (``calibrate --compute``):
    its jobs get the cluster's coefficients with that compute in place, in the daemon's
    predictions (the catalog), in a policy's training stream and in the simulated
    backend; gpt-char's keep the cluster's. Calibrating again without it drops it."""
    from autotune.catalog import applications
    from autotune.core import JobSpec
    from autotune.daemon.backends import build_backend
    from autotune.daemon.settings import Settings
    from autotune.interfaces import JobSubmission

    monkeypatch.setattr(applications, "_CALIBRATED", {})
    monkeypatch.setattr(applications, "_CALIBRATED_TASKS", {})
    own = {"mfu": 0.4, "compute_overhead_s": 0.012}
    report = {
        **REPORT,
        "statistics": {"mlp-synthetic": {"compute": {"coefficients": own, "configs": []}}},
    }
    save_cluster(_cluster().with_calibration(report), tmp_path / "cluster.json")
    cluster = load_cluster(tmp_path / "cluster.json")
    assert cluster.coefficients is not None
    mlp = cluster.task_coefficients["mlp-synthetic"]
    assert (mlp.mfu, mlp.compute_overhead_s) == (0.4, 0.012)
    assert mlp.inter_latency_s == cluster.coefficients.inter_latency_s == 0.003
    assert set(cluster.task_coefficients) == {"mlp-synthetic"}
    profiles = {t: BUILTIN_TASKS[t].profile for t in ("gpt-char", "mlp-synthetic")}
    assert catalog_coefficients(profiles["mlp-synthetic"], "CPU-calibrated") == mlp
    assert catalog_coefficients(profiles["gpt-char"], "CPU-calibrated") == cluster.coefficients
    mix, batches = task_mix(["gpt-char", "mlp-synthetic"], 2)
    stream = job_stream(
        np.random.default_rng(0), mean_interarrival_s=60, initial_jobs=6, max_jobs=6,
        mix=mix, batches=batches, coeffs=cluster.coefficients,
        task_coeffs=cluster.task_coefficients,
    )  # fmt: skip
    want = {"gpt-char": cluster.coefficients, "mlp-synthetic": mlp}
    jobs = list(stream)
    assert {j.task for j in jobs} == set(want)
    assert all(j.coeffs == want[str(j.task)] for j in jobs)
    sim = build_backend(
        Settings(backend="sim", cluster_file=tmp_path / "cluster.json", sim_initial_jobs=0)
    )
    assert isinstance(sim, SimulatedCluster)
    for job_id, task in (("a", "mlp-synthetic"), ("b", "gpt-char")):
        spec = JobSpec(job_id=job_id, model=profiles[task], global_batch=64, max_gpus=2)
        sim.submit(JobSubmission(spec=spec, task=task, steps=100))
    sim.observe()
    assert sim.coefficients("a") == mlp
    assert sim.coefficients("b") == cluster.coefficients
    # Recalibrating the links without --compute: every task on the cluster's again.
    cluster.with_calibration(REPORT)
    assert catalog_coefficients(profiles["mlp-synthetic"], "CPU-calibrated") == (
        cluster.coefficients
    )


def test_the_commands_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    save_cluster(_cluster(), tmp_path / "cluster.json")
    cluster = str(tmp_path / "cluster.json")
    out = tmp_path / "policy"
    task_alone = cli("train-policy", "--out", str(out), "--task", "gpt-char")
    assert task_alone.exit_code != 0
    assert "--cluster-file" in task_alone.stderr
    bad_task = cli(
        "train-policy", "--out", str(out), "--cluster-file", cluster, "--task", "no-such-task"
    )
    assert bad_task.exit_code != 0
    assert "unknown task" in bad_task.stderr
    assert not out.exists()
    no_ray = cli("calibrate", "--cluster-file", cluster)
    assert no_ray.exit_code != 0
    assert "--ray-address" in no_ray.stderr
    with_out = cli("calibrate", "--cluster-file", cluster, "--ray-address", "x:1", "--out", "p")
    assert with_out.exit_code != 0
    assert "--out" in with_out.stderr
    compute_alone = cli("calibrate", "--compute", "mlp-synthetic")
    assert compute_alone.exit_code != 0
    assert "--cluster-file" in compute_alone.stderr
    compute_no_ray = cli("calibrate", "--cluster-file", cluster, "--compute", "mlp-synthetic")
    assert compute_no_ray.exit_code != 0
    assert "--ray-address" in compute_no_ray.stderr
    bad_compute = cli(
        "calibrate", "--cluster-file", cluster, "--ray-address", "x:1", "--compute", "nope"
    )
    assert bad_compute.exit_code != 0
    assert "--compute 'nope'" in bad_compute.stderr


def test_the_time_to_target_bench_reads_a_calibrated_cluster_file(tmp_path: Path) -> None:
    from autotune.benchmarks.time_to_target import _calibration

    assert _calibration(None) is None
    save_cluster(_cluster().with_calibration(REPORT), tmp_path / "calibrated.json")
    found = _calibration(tmp_path / "calibrated.json")
    assert found is not None
    assert found["device"] == REPORT["device"]
    assert found["coefficients"] == COEFFICIENTS
    save_cluster(_cluster(), tmp_path / "plain.json")
    with pytest.raises(SystemExit, match="holds no calibration"):
        _calibration(tmp_path / "plain.json")


def test_the_noise_scale_of_the_runs_to_the_target_wins_over_the_calibrations_first_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The link calibration's 20-step runs measure a scale from early in training (1-4
    samples for gpt-char); the efficiency measurement's runs to the target measure it
    where the job spends its steps (28-45): where both are in the file, the second is
    the task's prior."""
    from autotune.catalog import tasks

    monkeypatch.setattr(tasks, "_MEASURED_NOISE", {})
    both = {"gpt-char": {"noise_scale": 2.0, "run_noise_scale": 33.0}}
    _cluster().with_calibration({**REPORT, "statistics": both})
    assert tasks.measured_noise_scale("gpt-char") == 33.0
    early = {"gpt-char": {"noise_scale": 2.0, "run_noise_scale": None}}
    _cluster().with_calibration({**REPORT, "statistics": early})
    assert tasks.measured_noise_scale("gpt-char") == 2.0


def test_the_noise_scale_a_calibration_measured_is_its_tasks_prior(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster file whose calibration measured gpt-char's gradient noise scale: loading
    it makes that the task's prior where a policy trains (the job stream) and where the
    daemon serves it (a submitted task's profile, the explanation), so a larger batch is
    no longer free; other tasks keep the catalog's."""
    from autotune.catalog import tasks
    from autotune.decision.explain import explain_decision
    from autotune.interfaces import JobMetrics
    from autotune.perf.model import batch_efficiency

    monkeypatch.setattr(tasks, "_MEASURED_NOISE", {})
    catalog = BUILTIN_TASKS["gpt-char"].profile
    assert catalog.noise_scale == 0
    assert batch_efficiency(catalog, 256) == 1.0
    report = {**REPORT, "statistics": {"gpt-char": {"noise_scale": 200.0, "global_batch": 64}}}
    save_cluster(_cluster().with_calibration(report), tmp_path / "cluster.json")
    monkeypatch.setattr(tasks, "_MEASURED_NOISE", {})
    assert tasks.task_profile("gpt-char") == catalog  # nothing loaded yet
    load_cluster(tmp_path / "cluster.json")
    prior = tasks.task_profile("gpt-char")
    assert prior == replace(catalog, noise_scale=200.0)
    assert tasks.task_profile("mlp-synthetic") == BUILTIN_TASKS["mlp-synthetic"].profile
    m0 = catalog.reference_batch
    assert batch_efficiency(prior, 256) == pytest.approx((200 + m0) / (200 + 256))
    assert tasks.resolve_task("gpt-char", []).model == prior
    mix, batches = task_mix(["gpt-char", "mlp-synthetic"], 2)
    jobs = list(
        job_stream(
            np.random.default_rng(0), mean_interarrival_s=60, initial_jobs=4, max_jobs=8,
            mix=mix, batches=batches,
        )
    )  # fmt: skip
    assert {j.spec.model.noise_scale for j in jobs if j.task == "gpt-char"} == {200.0}
    assert {j.spec.model for j in jobs if j.task == "mlp-synthetic"} <= {
        BUILTIN_TASKS["mlp-synthetic"].profile
    }
    # The explanation names where the batch's efficiency came from.
    spec = next(j.spec for j in jobs if j.task == "gpt-char")
    config = JobConfig(layout=Layout(world_size=2, dp=2), precision=PrecisionMap.uniform("fp32"))
    cluster = load_cluster(tmp_path / "cluster.json")
    placement = Placement(
        job_id=spec.job_id,
        ranks=tuple(RankSlot(rank=i, node_id=f"m{i}", gpu_index=0) for i in range(2)),
    )
    nodes = {n.node_id: n for n in cluster.nodes}

    def source(metrics: JobMetrics) -> str:
        found = explain_decision(
            spec=spec, config=config, placement=placement, nodes=nodes, features={},
            why="test", metrics=metrics,
        )["statistical_efficiency"]["batch"]  # fmt: skip
        return str(found["source"])

    assert source(JobMetrics()).startswith("measured in the cluster's calibration")
    assert source(JobMetrics(noise_scale=50.0)) == "measured noise scale"
    with pytest.raises(ValueError, match="positive"):
        tasks.register_noise_scale("gpt-char", 0.0)
    with pytest.raises(ValueError, match="not a built-in task"):
        tasks.register_noise_scale("no-such-task", 1.0)


def test_the_compression_efficiency_a_calibration_measured_is_its_tasks_price(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster file whose calibration measured resnet-mini's efficiency under top-k 1%:
    loading it charges the task that efficiency instead of the catalog's constant, in its
    goodput (the simulated cluster's and the daemon's estimate) and in the explanation;
    a compression it did not measure, and other tasks, keep the constant."""
    from autotune.catalog import tasks
    from autotune.core import CompressionSpec
    from autotune.decision.explain import explain_decision
    from autotune.interfaces import JobMetrics
    from autotune.perf.model import compression_efficiency, statistical_efficiency

    monkeypatch.setattr(tasks, "_MEASURED_NOISE", {})
    monkeypatch.setattr(tasks, "_MEASURED_COMPRESSION", {})
    topk = CompressionSpec(kind="topk", ratio=0.01)
    int8 = CompressionSpec(kind="int8")
    catalog = BUILTIN_TASKS["resnet-mini"].profile
    constant = compression_efficiency(topk)
    assert compression_efficiency(topk, catalog) == constant
    measured = {"topk:0.01": 0.25, "powersgd:4": 0.9}
    report = {**REPORT, "statistics": {"resnet-mini": {"compression_efficiency": measured}}}
    save_cluster(_cluster().with_calibration(report), tmp_path / "cluster.json")
    load_cluster(tmp_path / "cluster.json")
    prior = tasks.task_profile("resnet-mini")
    assert dict(prior.compression_efficiency) == measured
    assert tasks.measured_compression_efficiency("resnet-mini") == measured
    assert tasks.task_profile("ctr-synthetic") == BUILTIN_TASKS["ctr-synthetic"].profile
    assert compression_efficiency(topk, prior) == 0.25
    assert compression_efficiency(int8, prior) == compression_efficiency(int8)
    layout = Layout(world_size=2, dp=2)
    dense = JobConfig(layout=layout)
    compressed = JobConfig(layout=layout, compression=topk)
    ratio = statistical_efficiency(prior, compressed, 64) / statistical_efficiency(prior, dense, 64)
    assert ratio == pytest.approx(0.25)
    assert tasks.resolve_task("resnet-mini", []).model == prior

    mix, batches = task_mix(["resnet-mini"], 2)
    stream = job_stream(
        np.random.default_rng(0), mean_interarrival_s=60, initial_jobs=2, max_jobs=2,
        mix=mix, batches=batches,
    )  # fmt: skip
    spec = next(stream).spec
    assert spec.model == prior
    placement = Placement(
        job_id=spec.job_id,
        ranks=tuple(RankSlot(rank=i, node_id=f"m{i}", gpu_index=0) for i in range(2)),
    )
    nodes = {n.node_id: n for n in load_cluster(tmp_path / "cluster.json").nodes}

    def explained(config: JobConfig) -> dict[str, Any]:
        found = explain_decision(
            spec=spec, config=config, placement=placement, nodes=nodes, features={},
            why="test", metrics=JobMetrics(),
        )["statistical_efficiency"]["compression"]  # fmt: skip
        return dict(found)

    assert explained(compressed) == {
        "value": 0.25,
        "source": "measured in the cluster's calibration (autotune calibrate --efficiency)",
    }
    assert explained(replace(compressed, compression=int8))["source"] == (
        "assumed (catalog constant)"
    )
    with pytest.raises(ValueError, match="not a built-in task"):
        tasks.register_compression_efficiency("no-such-task", measured)
    with pytest.raises(ValueError, match=r"in \(0, 4.0\]"):
        tasks.register_compression_efficiency("resnet-mini", {"int8": 4.5})
    with pytest.raises(ValueError, match="topk:RATIO"):
        tasks.register_compression_efficiency("resnet-mini", {"topk": 0.5})


@pytest.mark.slow
def test_calibrate_measures_a_tasks_efficiencies_into_the_cluster_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For real, short: mlp-synthetic dense and under each of the policy's compressions
    (2 local processes, 20 steps, one seed), saved into a calibrated cluster file beside
    what it held; loading the file charges the task what was measured."""
    from autotune.catalog import tasks
    from autotune.catalog.clusters import load_cluster, save_cluster
    from autotune.rl.action import COMPRESSIONS

    monkeypatch.setattr(tasks, "_MEASURED_NOISE", {})
    monkeypatch.setattr(tasks, "_MEASURED_COMPRESSION", {})
    path = tmp_path / "cluster.json"
    save_cluster(_cluster(), path)
    refused = cli("calibrate", "--cluster-file", str(path), "--efficiency", "mlp-synthetic")
    assert refused.exit_code != 0
    assert "calibrate the cluster first" in refused.output
    nowhere = cli("calibrate", "--efficiency", "mlp-synthetic")
    assert nowhere.exit_code != 0
    assert "give --cluster-file" in nowhere.output
    report = {**REPORT, "statistics": {"mlp-synthetic": {"noise_scale": 30.0}}}
    save_cluster(_cluster().with_calibration(report), path)
    done = cli(
        "calibrate", "--cluster-file", str(path), "--efficiency", "mlp-synthetic",
        "--efficiency-steps", "20", "--efficiency-seeds", "1", "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    saved = json.loads(path.read_text())["calibration"]
    assert saved["coefficients"] == REPORT["coefficients"]
    figures = saved["statistics"]["mlp-synthetic"]
    assert printed["statistics"]["mlp-synthetic"] == figures
    assert figures["noise_scale"] == 30.0
    measured = figures["compression_efficiency"]
    assert set(measured) == {str(c) for c in COMPRESSIONS if c.kind != "none"}
    assert all(0 < v <= 1 for v in measured.values()), "one seed is credited no gain"
    runs = figures["efficiency_runs"]
    assert len(runs) == len(measured)
    for run in runs:
        assert run["dense_steps"] <= 20
        assert run["steps"] is None or run["efficiency"] == pytest.approx(
            min(MAX_COMPRESSION_EFFICIENCY, run["dense_steps"] / run["steps"]), abs=1e-4
        )
    assert figures["efficiency_protocol"]["limit_steps"] == 40
    monkeypatch.setattr(tasks, "_MEASURED_COMPRESSION", {})
    load_cluster(path)
    assert dict(tasks.task_profile("mlp-synthetic").compression_efficiency) == measured


def test_recalibrating_the_links_keeps_the_efficiencies_measured_before() -> None:
    """``autotune calibrate --cluster-file F --ray-address A`` writes a fresh report (the
    links fitted again, gpt-char's noise scale measured again): the compression
    efficiencies an earlier ``--efficiency`` measured of other tasks stay, those of a
    task measured again are replaced."""
    from autotune.cli.executor import _keep_measured

    previous = {
        **REPORT,
        "statistics": {
            "gpt-char": {"noise_scale": 5.0, "compression_efficiency": {"int8": 0.9}},
            "resnet-mini": {
                "compression_efficiency": {"topk:0.01": 0.29},
                "efficiency_runs": [],
                "efficiency_protocol": {"n_steps": 150},
            },
            "ctr-synthetic": {"compression_efficiency": {"topk:0.01": 0.8}},
        },
    }
    fresh: dict[str, Any] = {**REPORT, "statistics": {"gpt-char": {"noise_scale": 7.0}}}
    _keep_measured(fresh, previous, ["ctr-synthetic"])
    assert fresh["statistics"] == {
        "gpt-char": {"noise_scale": 7.0, "compression_efficiency": {"int8": 0.9}},
        "resnet-mini": previous["statistics"]["resnet-mini"],
    }
    untouched: dict[str, Any] = dict(REPORT)
    _keep_measured(untouched, None, [])
    assert "statistics" not in untouched
