"""The learned policy of the Pollux-compatible mode: its action (every job's weight in
the goodput allocation), its reward (minus job-hours), imitation of ``goodput-size``,
serving it in ``autotune pollux eval``, and the mode's oracle."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import cli

from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import pollux_nodes
from autotune.envs.simulator import Arrival
from autotune.interfaces import ClusterSnapshot
from autotune.policies.evaluate import run_episode
from autotune.policies.ppo import (
    SlotPolicyModule,
    _demonstrations,
    behaviour_clone,
    make_train_env,
)
from autotune.policies.ppo_settings import PPOSettings, TraceSource
from autotune.policies.serving import IncompatiblePolicyError, PolicyServer
from autotune.rl.action import InvalidActionError
from autotune.rl.observation import HEADER, SLOT, observation_size
from autotune.studies.pollux.env import (
    RESTART_S,
    ROUND_S,
    WEIGHT_RANGE,
    PolluxCompatEnv,
    compat_arrivals,
    decode_weights,
    encode_weights,
)
from autotune.studies.pollux.goodput import GoodputPolicy, SizedGoodputPolicy, size_weight
from autotune.studies.pollux.learned import ALLOCATION_FILE, WORLD, PolluxLearnedPolicy
from autotune.studies.pollux.oracle import MeasuredOraclePolicy


def _jobs(pollux_dir: Path, n: int = 24, workload: int = 6) -> list[Arrival]:
    """The first ``n`` jobs of a workload on their measured physics, Pollux's clock."""
    return compat_arrivals(
        pollux_dir / "workloads" / f"workload-{workload}.csv", pollux_dir / "traces"
    )[:n]


def _env(jobs: list[Arrival], slots: int = 32, gpus: int = 64) -> PolluxCompatEnv:
    return PolluxCompatEnv(
        ClusterEnv(
            nodes=pollux_nodes(gpus),
            jobs=jobs,
            slots=slots,
            round_s=ROUND_S,
            restart_s=RESTART_S,
            start_s=RESTART_S,
            noise=False,
            max_steps=100_000,
        )
    )


def _jct_s(env: PolluxCompatEnv) -> list[float]:
    assert env.sim is not None
    return [
        (j.status.finished_s or math.nan) - j.status.spec.submitted_at
        for j in env.sim.finished_jobs()
    ]


def _zero_action_jcts(env: PolluxCompatEnv) -> list[float]:
    """The sorted JCTs of an episode played with the zero action every round."""
    env.reset(seed=0)
    while True:
        *_, terminated, truncated, _ = env.step(np.zeros(env.slots, np.float32))
        if terminated or truncated:
            break
    return sorted(_jct_s(env))


def _together(jobs: list[Arrival]) -> list[Arrival]:
    """``jobs`` all submitted with the first."""
    first = jobs[0].spec.submitted_at
    return [replace(a, spec=replace(a.spec, submitted_at=first)) for a in jobs]


def test_the_action_is_a_log2_weight_per_slot(pollux_dir: Path) -> None:
    env = _env(_together(_jobs(pollux_dir, 4)), slots=8)
    assert isinstance(env.action_space, gym.spaces.Box)
    assert env.action_space.shape == (8,)
    assert (env.action_space.low[0], env.action_space.high[0]) == WEIGHT_RANGE
    env.reset(seed=0)
    assert env.snapshot is not None
    weights = decode_weights(np.array([1, -2, 99, 0, 0, 0, 0, 0.0]), env.snapshot, 8)
    slot_ids = [j.spec.job_id for j in env.snapshot.queue_order()]
    assert [weights[i] for i in slot_ids[:3]] == [2.0, 0.25, 2.0 ** WEIGHT_RANGE[1]]
    back = encode_weights(weights, env.snapshot, 8)
    assert back[:3].tolist() == [1.0, -2.0, WEIGHT_RANGE[1]]
    with pytest.raises(InvalidActionError, match="entries"):
        decode_weights(np.zeros(7), env.snapshot, 8)
    with pytest.raises(InvalidActionError, match="finite"):
        decode_weights(np.full(8, np.nan), env.snapshot, 8)


def test_equal_weights_play_exactly_as_goodput(pollux_dir: Path) -> None:
    """The environment's decoder is the goodput allocation: weight 1 everywhere (action
    0) gives the jobs the same completion times as ``goodput`` itself."""
    jobs = _jobs(pollux_dir)
    by_action = _zero_action_jcts(_env(jobs))
    env2 = _env(jobs)
    run_episode(GoodputPolicy(env2), env2, seed=0)
    assert len(by_action) == len(jobs)
    assert by_action == sorted(_jct_s(env2))


def test_the_action_needs_an_episode(pollux_dir: Path) -> None:
    """The allocation the action acts through is built with each episode."""
    env = _env(_jobs(pollux_dir, 2))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(32, np.float32))


def test_the_jct_reward_sums_to_minus_the_job_hours(pollux_dir: Path) -> None:
    env = _env(_jobs(pollux_dir))
    env.reset(seed=0)
    total = 0.0
    while True:
        _, reward, terminated, truncated, info = env.step(np.zeros(32, np.float32))
        assert info["reward_parts"] == {"jct": reward}
        total += float(reward)
        if terminated or truncated:
            break
    hours = sum(_jct_s(env)) / 3600
    # Jobs are counted per 60 s round: within a round per job of the true total.
    assert total == pytest.approx(-hours, abs=len(_jct_s(env)) * 60 / 3600)


def test_weights_move_gpus_to_the_heavier_job(pollux_dir: Path) -> None:
    jobs = _jobs(pollux_dir, 6)
    env = _env(_together([jobs[0], jobs[4]]), gpus=8)  # cifar10 and bert on two nodes
    env.reset(seed=0)
    snapshot = env.snapshot
    assert snapshot is not None
    a, b = (j.spec.job_id for j in snapshot.by_state("pending")[:2])
    allocator = GoodputPolicy(env)

    def gpus(weights: dict[str, float]) -> dict[str, int]:
        out = allocator.allocate(snapshot, weights)
        return {k: c.config.world_size for k, c in out.items() if c.config is not None}

    favour_a, favour_b = gpus({a: 64.0, b: 1 / 64}), gpus({a: 1 / 64, b: 64.0})
    assert favour_a[a] > favour_b[a]
    assert favour_b[b] > favour_a[b]
    assert sum(favour_a.values()) == sum(favour_b.values()) == 8


def test_goodput_size_weighs_jobs_by_their_remaining_time(pollux_dir: Path) -> None:
    assert size_weight(3600.0) == 1.0
    assert size_weight(900.0) == 2.0
    assert size_weight(1.0) == size_weight(60.0)  # at least a minute
    assert size_weight(900.0, exponent=1.0) == 4.0
    assert size_weight(900.0, exponent=0.0) == 1.0  # plain goodput
    env = _env(_together(_jobs(pollux_dir, 6)))
    env.reset(seed=0)
    assert env.snapshot is not None
    policy = SizedGoodputPolicy(env)
    policy.decide(env.snapshot)
    left = policy.remaining_s(env.snapshot)
    assert len(left) == 6
    assert set(policy.last_weights) == set(left)
    assert all(policy.last_weights[k] == size_weight(v) for k, v in left.items())
    with pytest.raises(ValueError, match="exponent"):
        SizedGoodputPolicy(env, exponent=-1.0)


def test_goodput_size_beats_goodput_and_pollux_on_workload_6(pollux_dir: Path) -> None:
    """Measured: 2,346 s against goodput's 2,433 s; Pollux's published 2,446 s."""
    env = _env(_jobs(pollux_dir, 160))
    sized = run_episode(SizedGoodputPolicy(env), env, seed=0)["avg_jct_s"]
    env = _env(_jobs(pollux_dir, 160))
    fair = run_episode(GoodputPolicy(env), env, seed=0)["avg_jct_s"]
    assert sized < fair
    assert sized < 2446


def test_the_oracle_maximises_summed_speed_up_on_measured_physics(pollux_dir: Path) -> None:
    env = _env(_jobs(pollux_dir, 12))
    result = run_episode(MeasuredOraclePolicy(env.cluster, slots=32), env, seed=0)
    assert result["n_jobs_done"] == 12
    env = _env(_together(_jobs(pollux_dir, 12)))
    env.reset(seed=0)
    assert env.snapshot is not None
    choices = MeasuredOraclePolicy(env.cluster, slots=32).decide(env.snapshot).choices
    total = sum(c.config.world_size for c in choices.values() if c.config is not None)
    assert 0 < total <= 64
    assert all("measured physics" in c.reason for c in choices.values() if c.config)


def _source(pollux_dir: Path, workload: int) -> TraceSource:
    return TraceSource(
        jobs=str(pollux_dir / "workloads" / f"workload-{workload}.csv"),
        kind="pollux-compat",
        traces=str(pollux_dir / "traces"),
    )


def _module(slots: int = 32) -> SlotPolicyModule:
    env = _env([], slots=slots)
    return SlotPolicyModule(
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"hidden": 16},
    )


def test_the_module_gives_a_gaussian_per_slot() -> None:
    from ray.rllib.core.columns import Columns

    module = _module(slots=4)
    assert module.continuous
    obs = torch.rand(3, observation_size(4))
    logits = module._forward({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    assert logits.shape == (3, 8)  # means of 4 slots, then their log-stds
    assert torch.allclose(logits[:, 4:], torch.full((3, 4), -1.0), atol=0.2)
    assert torch.equal(module.greedy(obs), logits[:, :4])
    dist = module.action_dist_cls.from_logits(logits)
    assert dist.sample().shape == (3, 4)


def test_imitation_fits_goodput_size_weights(pollux_dir: Path) -> None:
    settings = PPOSettings(slots=32, sources=(_source(pollux_dir, 6),), warm_start="goodput-size")
    demos = _demonstrations(settings, "goodput-size", 1)
    obs, actions, occupied, returns = demos
    assert obs.shape[1] == observation_size(32)
    assert actions.shape == (len(obs), 32)
    assert occupied.sum() > len(obs)  # several jobs at a time
    assert (actions[occupied == 0] == 0).all()
    assert returns[0] < 0  # minus the job-hours to come
    module = _module()
    first = behaviour_clone(module, demos, epochs=1, seed=0)
    last = behaviour_clone(module, demos, epochs=8, seed=0)
    assert last < first
    with pytest.raises(ValueError, match="goodput-size"):
        _demonstrations(settings, "oracle", 1)


def test_compat_sources_cannot_mix_with_the_default_world(pollux_dir: Path) -> None:
    wl = str(pollux_dir / "workloads" / "workload-6.csv")
    settings = PPOSettings(sources=(_source(pollux_dir, 6), TraceSource(jobs=wl, kind="pollux")))
    from dataclasses import asdict

    with pytest.raises(ValueError, match="cannot be mixed"):
        make_train_env(asdict(settings))
    with pytest.raises(ValueError, match="traces"):
        WORLD.make_env(replace(_source(pollux_dir, 6), traces=None), settings, None)


def test_the_served_policy_acts_through_the_allocation(pollux_dir: Path, tmp_path: Path) -> None:
    module = _module()
    module.save_to_path(tmp_path / "module")
    server = PolicyServer(tmp_path / "module", slots=32, continuous=True)
    env = _env(_jobs(pollux_dir, 10))
    policy = PolluxLearnedPolicy(env.cluster, server, forecast="none")
    assert policy.version.startswith("ppo-pollux-")
    assert policy.fairness_p == -1.0  # no allocation file: Pollux's
    (tmp_path / "module" / ALLOCATION_FILE).write_text(json.dumps({"fairness_p": -0.25}))
    assert PolluxLearnedPolicy(env.cluster, server, forecast="none").allocator.p == -0.25
    result = run_episode(policy, env, seed=0)
    assert result["n_jobs_done"] == 10
    # A module of one world is refused in the other, saying which world it needs.
    with pytest.raises(IncompatiblePolicyError, match="study's world"):
        PolicyServer(tmp_path / "module", slots=32)
    with pytest.raises(IncompatiblePolicyError, match="default world"):
        PolicyServer(None, slots=32, continuous=True)


def test_eval_serves_a_compat_checkpoint(pollux_dir: Path, tmp_path: Path) -> None:
    _module().save_to_path(tmp_path / "module")
    workload = str(pollux_dir / "workloads" / "workload-6.csv")
    run = cli(
        "pollux", "eval", "--workload", workload,
        "--policies", "ppo,oracle,goodput-size", "--policy-checkpoint", str(tmp_path / "module"),
        "--limit-jobs", "10", "--forecast", "none", "--json",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert {row["n_jobs_done"] for row in report["policies"].values()} == {10.0}
    run = cli("pollux", "eval", "--workload", workload, "--policies", "ppo", "--limit-jobs", "5")
    assert run.exit_code == 2
    assert "--policy-checkpoint" in run.stderr


def test_train_refuses_a_compat_run_without_workloads(tmp_path: Path, pollux_dir: Path) -> None:
    run = cli("pollux", "train-policy", "--out", str(tmp_path / "o"))
    assert run.exit_code == 2
    assert "--workload" in run.stderr
    workload = str(pollux_dir / "workloads" / "workload-6.csv")
    run = cli(
        "pollux", "train-policy", "--out", str(tmp_path / "o"),
        "--workload", workload, "--warm-start", "oracle",
    )  # fmt: skip
    assert run.exit_code == 2
    assert "goodput-size" in run.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_train_in_compat_mode_then_evaluate(tmp_path: Path, pollux_dir: Path) -> None:
    """The README's commands: train on one workload (imitation, one PPO iteration),
    evaluate on another with the checkpoint."""
    out = tmp_path / "policy"
    run = cli(
        "pollux", "train-policy", "--out", str(out),
        "--workload", str(pollux_dir / "workloads" / "workload-1.csv"),
        "--iterations", "1", "--train-batch", "64", "--no-forecast", "--json",
        "--size-exponent", "1", "--fairness-p", "-0.5",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["warm_start"]["teacher"] == "goodput-size"
    assert report["settings"]["world_options"]["size_exponent"] == 1.0
    saved = json.loads((Path(report["module"]) / ALLOCATION_FILE).read_text())
    assert saved == {"world": "pollux-compat", "fairness_p": -0.5, "residual_exponent": None}
    assert (out / "warm_start" / ALLOCATION_FILE).is_file()
    assert report["settings"]["sources"][0]["kind"] == "pollux-compat"
    run = cli(
        "pollux", "eval", "--workload", str(pollux_dir / "workloads" / "workload-6.csv"),
        "--policies", "ppo", "--policy-checkpoint", report["module"],
        "--limit-jobs", "12", "--forecast", "none", "--json",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["policies"]["ppo"]["n_jobs_done"] == 12


def _residual_env(jobs: list[Arrival], slots: int = 32, exponent: float = 0.5) -> PolluxCompatEnv:
    env = _env(jobs, slots=slots)
    return PolluxCompatEnv(env.cluster, residual_exponent=exponent)


def test_a_residual_action_corrects_the_teachers_weights(pollux_dir: Path) -> None:
    env = _residual_env(_together(_jobs(pollux_dir, 6)), slots=4)
    env.reset(seed=0)
    snapshot = env.snapshot
    assert snapshot is not None
    assert isinstance(env.allocator, SizedGoodputPolicy)
    base = env.allocator.weights(snapshot)
    ids = [j.spec.job_id for j in snapshot.queue_order()]
    assert len(base) == 6
    weights = decode_weights(np.array([1.0, -1.0, 0.0, 0.0]), snapshot, 4, base)
    assert weights[ids[0]] == pytest.approx(2 * base[ids[0]])
    assert weights[ids[1]] == pytest.approx(base[ids[1]] / 2)
    assert weights[ids[2]] == pytest.approx(base[ids[2]])
    # Beyond the four slots: the teacher's weight, not 1.
    assert [weights[i] for i in ids[4:]] == [base[i] for i in ids[4:]]
    assert encode_weights(weights, snapshot, 4, base).tolist() == pytest.approx([1, -1, 0, 0])


def test_the_zero_residual_plays_exactly_as_its_teacher(pollux_dir: Path) -> None:
    """A residual policy starts as its teacher: the zero action gives every job the
    completion time ``goodput-size`` gives it (at the same exponent and p)."""
    jobs = _jobs(pollux_dir)
    env = _residual_env(jobs, exponent=1.0)
    env.fairness_p = -0.5
    by_action = _zero_action_jcts(env)
    env2 = _env(jobs)
    run_episode(SizedGoodputPolicy(env2, exponent=1.0, p=-0.5), env2, seed=0)
    assert len(by_action) == len(jobs)
    assert by_action == sorted(_jct_s(env2))
    # And the teacher's demonstrations in the residual world are all zero corrections.
    settings = PPOSettings(
        slots=32,
        sources=(_source(pollux_dir, 6),),
        warm_start="goodput-size",
        world_options={"residual": 1.0},
        max_steps=40,
    )
    _, actions, occupied, _ = _demonstrations(settings, "goodput-size", 1)
    assert occupied.sum() > 0
    assert not actions.any()


def test_the_pooled_module_reads_the_other_jobs() -> None:
    """``pooled``: a slot's action depends on the other slots' jobs (a mean over them);
    without it, only on its own; both act on any number of slots."""
    from ray.rllib.core.columns import Columns

    env = _env([], slots=4)
    obs = torch.rand(1, observation_size(4))
    obs[0, HEADER :: len(SLOT)] = 1.0  # every slot occupied
    other = obs.clone()
    other[0, HEADER + 3 * len(SLOT) + 2] += 0.5  # slot 3's job changes
    for pooled in (False, True):
        module = SlotPolicyModule(
            observation_space=env.observation_space,
            action_space=env.action_space,
            model_config={"hidden": 16, "pooled": pooled},
        )
        nn_init = torch.nn.init
        nn_init.normal_(module.logits.weight, std=1.0)  # visible differences

        def means(x: torch.Tensor, module: SlotPolicyModule = module) -> torch.Tensor:
            return module.greedy(x)[0]

        a, b = means(obs), means(other)
        assert torch.equal(a[:3], b[:3]) != pooled
        assert a[3] != b[3]
        wider = torch.rand(1, observation_size(40))
        assert module._forward({Columns.OBS: wider})[Columns.ACTION_DIST_INPUTS].shape == (1, 80)


def test_every_active_job_is_the_policys_however_many(pollux_dir: Path, tmp_path: Path) -> None:
    """300 active jobs against 32 trained slots: each gets the policy's weight (a module
    whose every mean is log2 weight 1: weight 2), not only the first 32."""
    jobs = _jobs(pollux_dir, 160)
    many = _together(
        jobs + [replace(a, spec=replace(a.spec, job_id=f"{a.spec.job_id}-b")) for a in jobs[:140]]
    )
    env = _env(many)
    env.reset(seed=0)
    snapshot = env.snapshot
    assert snapshot is not None
    assert len(snapshot.queue_order()) == 300
    module = _module()
    with torch.no_grad():
        module.logits.weight.zero_()
        module.logits.bias[0] = 1.0
    module.save_to_path(tmp_path / "module")
    server = PolicyServer(tmp_path / "module", slots=32, continuous=True)
    for every_job, weighted in ((True, 300), (False, 32)):
        policy = PolluxLearnedPolicy(env.cluster, server, forecast="none", every_job=every_job)
        seen: dict[str, float] = {}
        allocate = policy.allocator.allocate

        def spy(
            snap: ClusterSnapshot,
            weights: dict[str, float],
            allocate: Any = allocate,
            seen: dict[str, float] = seen,
        ) -> Any:
            seen.update(weights)
            return allocate(snap, weights)

        policy.allocator.allocate = spy  # type: ignore[method-assign]
        choices = policy.decide(snapshot).choices
        assert sum(1 for w in seen.values() if w == pytest.approx(2.0)) == weighted
        assert sum(c.config.world_size for c in choices.values() if c.config) <= 64
