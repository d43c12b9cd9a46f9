"""The Gymnasium environment, the simulator's dynamics, the baselines and `autotune eval`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from helpers import autotune_command

import autotune.envs  # noqa: F401 - registers the environments
from autotune.catalog.profiles import MODEL_CATALOG
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import small_nodes
from autotune.envs.simulator import Choice, ClusterSimulator, Job, SimConfig
from autotune.envs.workloads import synthetic_jobs
from autotune.perf.model import DEFAULT_COEFFICIENTS
from autotune.policies.baselines import BASELINES, make_policy
from autotune.policies.evaluate import METRICS, evaluate, run_episode


@pytest.mark.parametrize("env_id", ["autotune/ClusterSmall-v0", "autotune/Cluster-v0"])
def test_check_env(env_id: str) -> None:
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def _trajectory(seed: int) -> list[tuple[float, bytes]]:
    env = gym.make("autotune/ClusterSmall-v0")
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    out = [(0.0, obs.tobytes())]
    for _ in range(40):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        out.append((float(reward), obs.tobytes()))
        if terminated or truncated:
            break
    return out


def test_same_seed_same_trajectory() -> None:
    assert _trajectory(7) == _trajectory(7)
    assert _trajectory(7) != _trajectory(8)


def _job(job_id: str, gpus: int, submit_s: float = 0.0, duration_s: float = 3600.0) -> Job:
    model = MODEL_CATALOG["gpt-125m"]
    return Job(
        job_id=job_id,
        model=model,
        coeffs=DEFAULT_COEFFICIENTS,
        submit_s=submit_s,
        work=0.0,
        duration_s=duration_s,
        base_batch=model.reference_batch,
        requested_gpus=gpus,
        min_gpus=1,
        max_gpus=2 * gpus,
    )


def test_static_config_reproduces_the_trace_duration_on_the_reference_gpu() -> None:
    nodes = [n for n in small_nodes() if n.gpu_model == "A100"]
    sim = ClusterSimulator(
        nodes,
        [_job("a", 4)],
        config=SimConfig(interval_s=60, noise=False),
        rng=np.random.default_rng(0),
    )
    while not sim.done:
        sim.advance({"a": Choice.for_gpus(4, batch=1)} if sim.now == 0 else {})
    (job,) = sim.finished
    assert job.finish_s == pytest.approx(3600.0, rel=0.02)


def test_fifo_queues_jobs_that_do_not_fit() -> None:
    nodes = [n for n in small_nodes() if n.gpu_model == "A100"]  # 8 GPUs
    jobs = [_job("a", 8), _job("b", 1, submit_s=0.0)]
    sim = ClusterSimulator(nodes, jobs, config=SimConfig(noise=False), rng=np.random.default_rng(0))
    sim.advance({})
    running = {j.job_id for j in sim.active if j.running}
    assert running == {"a"}  # b waits behind a although it is small: strict FIFO
    while not sim.done:
        sim.advance({})
    a, b = sorted(sim.finished, key=lambda j: j.job_id)
    assert b.start_s is not None
    assert a.finish_s is not None
    assert b.start_s >= a.finish_s - 300


def test_reconfiguration_costs_a_restart() -> None:
    nodes = small_nodes()
    sim = ClusterSimulator(
        nodes, [_job("a", 2)], config=SimConfig(noise=False), rng=np.random.default_rng(0)
    )
    sim.advance({"a": Choice.for_gpus(2)})
    outcome = sim.advance({"a": Choice.for_gpus(4)})
    assert outcome.restarts == 1
    assert outcome.normalized_goodput < sim.advance({}).normalized_goodput


def test_out_of_memory_config_fails_the_job() -> None:
    model = MODEL_CATALOG["gpt-7b"]
    job = Job(
        job_id="big",
        model=model,
        coeffs=DEFAULT_COEFFICIENTS,
        submit_s=0,
        work=1e6,
        base_batch=32,
        requested_gpus=1,
        min_gpus=1,
        max_gpus=1,
    )
    sim = ClusterSimulator(
        small_nodes(), [job], config=SimConfig(noise=False), rng=np.random.default_rng(0)
    )
    outcome = sim.advance({"big": Choice.for_gpus(1)})
    assert outcome.ooms == 1
    assert sim.failed == [job]
    assert sim.done


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_finishes_the_small_workload(name: str) -> None:
    rng = np.random.default_rng(3)
    jobs = synthetic_jobs(rng, n_jobs=10, mean_interarrival_s=600, median_duration_s=1800)
    policy = make_policy(name, 0)
    env = ClusterEnv(
        nodes=small_nodes(), jobs=jobs, slots=8, max_steps=5000, queue_order=policy.queue_order
    )
    result = run_episode(policy, env, seed=0)
    assert set(result) == set(METRICS)
    assert result["n_jobs_done"] + len(env.sim.failed if env.sim else []) == 10
    assert 0 < result["gpu_util"] <= 1


def test_rules_beat_static_and_oracle_beats_rules_on_goodput() -> None:
    rng = np.random.default_rng(11)
    jobs = synthetic_jobs(rng, n_jobs=16, mean_interarrival_s=400, median_duration_s=2400)
    report = evaluate(
        nodes=small_nodes(), jobs=jobs, policies=["static", "rules", "oracle"], seeds=2, slots=8
    )
    runs = report["policies"]
    for seed in range(2):
        static, rules, oracle = (
            runs[p]["per_seed"][seed]["goodput"] for p in ("static", "rules", "oracle")
        )
        assert static < rules <= oracle


@pytest.mark.subprocess
def test_eval_command_on_a_philly_style_trace(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus\n0,1800,1\n60,3600,2\n120,900,4\n600,2400,8\n")
    result = subprocess.run(
        [
            *autotune_command(),
            "eval",
            "--philly-jobs",
            str(trace),
            "--gpus",
            "16",
            "--policies",
            "static,rules,tiresias",
            "--seeds",
            "2",
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
    assert report["trace"]["jobs"] == 4
    assert report["trace"]["gpus"] == 16
    for row in report["policies"].values():
        assert set(METRICS) <= set(row)
        assert len(row["per_seed"]) == 2
        assert row["n_jobs_done"] + row["n_jobs_failed"] == 4
        assert row["n_jobs_done"] >= 3


@pytest.mark.subprocess
def test_eval_command_rejects_two_traces(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus\n0,1800,1\n")
    result = subprocess.run(
        [*autotune_command(), "eval", "--philly-jobs", str(trace), "--pollux-workload", str(trace)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "one trace" in result.stderr


@pytest.mark.slow
def test_eval_on_pollux_workload_6(pollux_dir: Path) -> None:
    from autotune.catalog.devices import node_info
    from autotune.envs.traces import pollux_workload
    from autotune.envs.workloads import jobs_from_trace

    nodes = [
        node_info(
            f"t4-{i}",
            gpu_model="T4",
            gpu_count=4,
            cpu_milli=48_000,
            memory_mib=196_608,
            inter_node_bandwidth_gbps=6.25,
        )
        for i in range(16)
    ]
    workload = pollux_dir / "workloads" / "workload-6.csv"
    jobs = jobs_from_trace(pollux_workload(workload))
    report = evaluate(nodes=nodes, jobs=jobs, policies=["static", "rules", "oracle"], seeds=2)
    for seed in range(2):
        g = {p: report["policies"][p]["per_seed"][seed]["goodput"] for p in report["policies"]}
        assert g["static"] < g["rules"] <= g["oracle"]
