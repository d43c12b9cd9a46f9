"""PPO training, policy serving, the daemon's fallback and the learned policies in
`autotune eval`: smoke tests with tiny budgets, through the real entry points."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import autotune_command

from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.planner import verify_placements
from autotune.policies.evaluate import run_episode
from autotune.policies.ppo import MODULE_PATH, SlotPolicyModule
from autotune.policies.serving import (
    IncompatiblePolicyError,
    LearnedPolicy,
    PolicyServer,
    default_policy_checkpoint,
)
from autotune.policies.trial_tuner import TrialTunerPolicy
from autotune.rl.action import ACTION_DIMS


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two PPO iterations after a one-episode imitation of rules, on synthetic jobs."""
    out = tmp_path_factory.mktemp("ppo")
    run = subprocess.run(
        [
            *autotune_command(),
            "train-policy",
            "--algo",
            "ppo",
            "--iterations",
            "2",
            "--train-batch",
            "64",
            "--max-steps",
            "16",
            "--slots",
            "4",
            "--round-s",
            "600",
            "--warm-start",
            "rules",
            "--warm-start-episodes",
            "1",
            "--hidden",
            "16",
            "--checkpoint-every",
            "1",
            "--out",
            str(out / "run"),
            "--json",
        ],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert len(report["history"]) == 2
    assert report["warm_start"]["teacher"] == "rules"
    assert report["warm_start"]["samples"] > 0
    return Path(report["checkpoint"])


@pytest.mark.ray
def test_training_writes_checkpoints(trained: Path) -> None:
    assert (trained / MODULE_PATH).is_dir()
    assert (trained.parent / "iter_0001" / MODULE_PATH).is_dir()
    assert (trained.parent / "report.json").is_file()


@pytest.mark.ray
def test_checkpoint_serves_any_slot_count(trained: Path) -> None:
    """Trained with 4 slots, the shared-slot module acts for 32 in a full episode."""
    server = PolicyServer(trained, slots=32)
    assert isinstance(server.module, SlotPolicyModule)
    env = ClusterEnv(slots=32, n_jobs=20, max_steps=30)
    obs, _ = env.reset(seed=0)
    action = server.act(obs)
    assert action.shape == (32 * len(ACTION_DIMS),)
    assert env.action_space.contains(action)
    assert np.array_equal(action, server.act(obs)), "inference is deterministic"
    metrics = run_episode(LearnedPolicy(trained, slots=32, round_s=env.round_s), env, seed=0)
    assert metrics["n_jobs_done"] > 0


def test_shipped_policy_loads_and_acts() -> None:
    server = PolicyServer(default_policy_checkpoint(), slots=16)
    env = gym.make("autotune/Cluster-v0").unwrapped
    assert isinstance(env, ClusterEnv)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        action = server.act(obs)
        assert env.action_space.contains(action)
        obs, *_ = env.step(action)


def _incompatible_module(path: Path) -> Path:
    """A valid RLModule checkpoint whose action space is not the env's."""
    module = SlotPolicyModule(
        observation_space=gym.spaces.Box(0, 1, (12 + 16,), np.float32),
        action_space=gym.spaces.MultiDiscrete([3, 3]),
        model_config={"hidden": 4},
    )
    module.save_to_path(path)
    return path


def _fallback_ticks(database: Database, policy: LearnedPolicy, ticks: int = 3) -> list:  # type: ignore[type-arg]
    from autotune.daemon.tick import Daemon, DaemonParts

    backend = SimulatedCluster(SimConfig(seed=0))
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=policy))
    daemon.start()
    decisions = []
    for _ in range(ticks):
        decisions.extend(daemon.tick().decisions)
    backend.close()
    return decisions


def _partial_module(path: Path) -> Path:
    """A checkpoint of the right spaces whose saved state lacks the policy's encoder."""
    import pickle

    env = ClusterEnv(slots=4)
    module = SlotPolicyModule(
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"hidden": 4},
    )
    module.save_to_path(path)
    state_file = path / "module_state.pkl"
    state = pickle.loads(state_file.read_bytes())
    state_file.write_bytes(
        pickle.dumps({k: v for k, v in state.items() if not k.startswith("encoder.")})
    )
    return path


@pytest.mark.parametrize("case", ["missing", "incompatible", "garbage", "partial"])
def test_daemon_falls_back_to_rules(
    case: str, database: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if case == "missing":
        checkpoint = tmp_path / "nothing-here"
    elif case == "incompatible":
        checkpoint = _incompatible_module(tmp_path / "module")
    elif case == "partial":
        checkpoint = _partial_module(tmp_path / "module")
    else:
        checkpoint = tmp_path / "junk"
        checkpoint.mkdir()
        (checkpoint / "module_state.pt").write_bytes(b"not a checkpoint")
    with caplog.at_level("WARNING", logger="autotune"):
        policy = LearnedPolicy(checkpoint)
    assert policy.server is None
    assert policy.fallback_reason
    assert any(r.getMessage() == "policy.fallback" for r in caplog.records)
    decisions = _fallback_ticks(database, policy)
    assert decisions, "the rules fallback places the waiting jobs"
    assert {d.source for d in decisions} == {"fallback"}
    assert all("fallback to rules" in d.reason for d in decisions)
    with database.session() as session:
        stored = repo.get_decision(session=session, decision_id=decisions[0].decision_id)
        assert stored is not None
        assert stored.decision.source == "fallback"
    with pytest.raises(IncompatiblePolicyError):
        PolicyServer(checkpoint)


@pytest.mark.ray
def test_daemon_decides_with_the_learned_policy(trained: Path, database: Database) -> None:
    policy = LearnedPolicy(trained)
    assert policy.server is not None
    backend = SimulatedCluster(SimConfig(seed=0))
    from autotune.daemon.tick import Daemon, DaemonParts

    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=policy))
    daemon.start()
    decisions = []
    for _ in range(3):
        decisions.extend(daemon.tick().decisions)
    assert decisions
    assert {d.source for d in decisions} == {"policy"}
    assert all(d.reason.startswith("ppo (slot ") for d in decisions)
    snapshot = backend.observe()
    running = {
        j.spec.job_id: j.placement for j in snapshot.by_state("running") if j.placement is not None
    }
    assert running
    assert verify_placements([j.spec for j in snapshot.jobs], snapshot.nodes, running) == []
    backend.close()


def test_trial_tuner_sets_each_job_once() -> None:
    env = ClusterEnv(small=True, slots=4, n_jobs=6, max_steps=128)
    policy = TrialTunerPolicy(env, budget_s=600, trial_s=120, seed=0)
    env.reset(seed=0)
    assert env.snapshot is not None
    assert env.sim is not None
    choices = policy.decide(env.snapshot).choices
    # Tuned on arrival, charged the trial budget as downtime served once it starts.
    assert policy.chosen
    for job_id, config in policy.chosen.items():
        assert choices[job_id].config == config
        assert env.sim.jobs[job_id].downtime_s == 600
    metrics = run_episode(policy, env, seed=0)
    assert metrics["n_jobs_done"] + metrics["n_jobs_failed"] == 6
    assert set(policy.trials.values()) == {5}
    assert len(policy.chosen) == 6
    # Set once: no job is ever reconfigured.
    assert all(job.restarts == 0 for job in env.sim.jobs.values())


@pytest.mark.ray
@pytest.mark.subprocess
def test_eval_with_learned_policies(pollux_dir: Path, trained: Path, tmp_path: Path) -> None:
    base = [
        *autotune_command(),
        "eval",
        "--pollux-workload",
        str(pollux_dir / "workloads" / "workload-6.csv"),
        "--gpus",
        "16",
        "--limit-jobs",
        "8",
        "--seeds",
        "1",
        "--json",
    ]
    run = subprocess.run(
        [*base, "--policies", "rules,ppo,tune", "--policy-checkpoint", str(trained)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert set(report["policies"]) == {"rules", "ppo", "tune"}
    for row in report["policies"].values():
        assert row["n_jobs_done"] + row["n_jobs_failed"] > 0
    bad = subprocess.run(
        [*base, "--policies", "ppo", "--policy-checkpoint", str(tmp_path / "none")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error:")


@pytest.mark.ray
@pytest.mark.subprocess
def test_asha_search_smoke(tmp_path: Path) -> None:
    """Two trials of at most two iterations under ASHA; every trial reports a return."""
    run = subprocess.run(
        [
            *autotune_command(),
            "tune-policy",
            "--samples",
            "2",
            "--iterations",
            "2",
            "--grace",
            "1",
            "--slots",
            "4",
            "--max-steps",
            "16",
            "--round-s",
            "600",
            "--out",
            str(tmp_path / "search"),
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["scheduler"] == "ASHA"
    assert len(report["trials"]) == 2
    for trial in report["trials"]:
        assert trial["error"] is None
        assert 1 <= trial["iterations"] <= 2
        assert 3e-5 <= trial["lr"] <= 1e-3
    assert report["best"]["episode_return_mean"] == max(
        t["episode_return_mean"] for t in report["trials"]
    )
