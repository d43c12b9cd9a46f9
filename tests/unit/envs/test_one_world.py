"""One world: the environment and the daemon run the same cluster model, encode the same
observation, decode the same configurations and take the same decision step."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from autotune.core import JobConfig, Layout
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.decision.step import decide
from autotune.envs import cluster_env
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.presets import default_nodes
from autotune.envs.simulator import Arrival, SimConfig, SimulatedCluster
from autotune.envs.spaces import action_space
from autotune.envs.workloads import synthetic_jobs
from autotune.interfaces import PolicyChoice
from autotune.planner import verify_placements
from autotune.policies.serving import LearnedPolicy
from autotune.rl.action import ACTION_DIMS, InvalidActionError, decode_action
from autotune.rl.observation import FEATURES, observation_size, slot_jobs


class ScriptedServer:
    """Stands in for a loaded RLModule: returns pre-drawn actions in order and records the
    observations it was given."""

    def __init__(self, actions: list[np.ndarray]) -> None:
        self.actions = list(actions)
        self.seen: list[np.ndarray] = []

    def act(self, observation: np.ndarray) -> np.ndarray:
        self.seen.append(observation.copy())
        return self.actions[len(self.seen) - 1]


def _actions(slots: int, n: int, seed: int) -> list[np.ndarray]:
    space = action_space(slots)
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def _jobs(n: int, seed: int) -> list[Arrival]:
    return synthetic_jobs(
        np.random.default_rng(seed), n_jobs=n, mean_interarrival_s=200, median_duration_s=1800
    )


def _state(sim: SimulatedCluster) -> list[tuple[object, ...]]:
    return [
        (j.job_id, j.status.state, j.status.config, j.status.placement, round(j.done, 6))
        for j in sorted(sim.jobs.values(), key=lambda j: j.job_id)
    ]


class RecordingCluster(SimulatedCluster):
    """The daemon's simulated backend, keeping its state as each tick observed it."""

    states: list[list[tuple[object, ...]]]

    def observe(self):  # type: ignore[no-untyped-def]
        snapshot = super().observe()
        self.states = [*getattr(self, "states", []), _state(self)]
        return snapshot


def test_the_env_and_the_daemon_see_and_decide_the_same(database: Database) -> None:
    slots, rounds, seed = 8, 12, 5
    jobs = _jobs(14, seed)
    actions = _actions(slots, rounds + 1, seed)
    # The environment: the action goes through its decoder and the decision step.
    env = ClusterEnv(nodes=default_nodes(), jobs=jobs, slots=slots, round_s=300)
    obs, _ = env.reset(seed=seed)
    assert env.sim is not None
    env_obs, env_states = [obs], [_state(env.sim)]
    for k in range(rounds):
        obs, *_ = env.step(actions[k])
        env_obs.append(obs)
        env_states.append(_state(env.sim))
    # The daemon: the same jobs on its simulated backend, the learned policy serving the
    # same actions through its own encoder and decoder, ticks committed to a database.
    backend = RecordingCluster(
        SimConfig(nodes=tuple(default_nodes()), round_s=300, initial_jobs=0, max_jobs=0),
        arrivals=jobs,
        rng=np.random.default_rng(seed),
    )
    server = ScriptedServer(actions)
    policy = LearnedPolicy(slots=slots, round_s=300, forecast=False, server=server)  # type: ignore[arg-type]
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=policy))
    daemon.start()
    decided = 0
    for _ in range(rounds + 1):
        decided += len(daemon.tick().decisions)
    assert decided > 0
    # Round by round: the same observation, and the same jobs in the same states with the
    # same configurations, placements and progress.
    assert len(server.seen) == rounds + 1
    for k in range(rounds + 1):
        np.testing.assert_array_equal(server.seen[k], env_obs[k], err_msg=f"round {k}")
        assert backend.states[k] == env_states[k], f"round {k}"
    assert env.sim.now == backend.now == rounds * 300


def test_decoded_configs_are_the_same_from_both_sides() -> None:
    slots = 6
    sim = SimulatedCluster(
        SimConfig(initial_jobs=10, max_jobs=10, seed=3), rng=np.random.default_rng(3)
    )
    snapshot = sim.observe()
    (action,) = _actions(slots, 1, 3)
    server = ScriptedServer([action])
    policy = LearnedPolicy(slots=slots, forecast=False, server=server)  # type: ignore[arg-type]
    served = policy.decide(snapshot).choices
    decoded = decode_action(action, snapshot, slots, source="ppo")
    assert {k: v.config for k, v in served.items()} == {k: v.config for k, v in decoded.items()}
    assert len(served) == 10  # 6 in slots (configured or waiting) and 4 waiting behind


def test_the_observation_table_in_the_docstring_is_the_encoder() -> None:
    doc = cluster_env.__doc__ or ""
    rows = re.findall(
        r"^\| (\d+)(?:\+\d+[mk])? \| (\S+) \| \[(\S+), (\S+)\] \| (.+) \|$", doc, re.M
    )
    documented = {
        name.replace("{m}", "0"): (int(index), float(low), float(high))
        for index, name, low, high, _ in rows
    }
    shown = [(i, n, f) for i, n, f in FEATURES if not re.match(r"gpu[1-9]\.", n)]
    assert len(documented) == len(shown)
    for index, name, feature in shown:
        assert documented[name] == (index, feature.low, feature.high), name
    # The GPU-model rows repeat every 7 entries for models 1-3.
    assert next(n for _, n, _ in FEATURES if n.startswith("gpu3.")) == "gpu3.present"


def test_observations_stay_within_the_declared_bounds() -> None:
    env = ClusterEnv(slots=16, n_jobs=40)
    obs, _ = env.reset(seed=2)
    env.action_space.seed(2)
    for _ in range(60):
        assert env.observation_space.contains(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert np.isfinite(env.observation_space.low).all()
    assert np.isfinite(env.observation_space.high).all()


def test_an_invalid_action_is_rejected_not_wrapped() -> None:
    env = ClusterEnv(slots=4, n_jobs=6)
    env.reset(seed=0)
    action = np.zeros(4 * len(ACTION_DIMS), dtype=np.int64)
    action[len(ACTION_DIMS) + 3] = len(ACTION_DIMS)  # slot 1, gpus: 7 options, 0..6
    action[len(ACTION_DIMS) + 3] = 7
    with pytest.raises(InvalidActionError, match=r"slot 1: gpus=7 is outside 0\.\.6"):
        env.step(action)
    with pytest.raises(InvalidActionError, match="expected"):
        env.step(action[:-1])


def _running_snapshot(job_gpus: int = 2):  # type: ignore[no-untyped-def]
    jobs = _jobs(1, 0)
    jobs = [replace(jobs[0], spec=replace(jobs[0].spec, max_gpus=8))]
    sim = SimulatedCluster(
        SimConfig(nodes=tuple(default_nodes()), noise=False, initial_jobs=0, max_jobs=0),
        arrivals=jobs,
        rng=np.random.default_rng(0),
    )
    sim.start()
    job_id = jobs[0].spec.job_id
    choice = PolicyChoice(config=JobConfig.data_parallel(job_gpus), reason="t")
    round_ = decide(sim.snapshot(), {job_id: choice}, {}, honoured={}, policy_version="test")
    sim.apply(round_.decisions)
    sim.advance()
    return sim, job_id


def test_the_policy_resizes_a_running_job_and_pays_the_restart() -> None:
    sim, job_id = _running_snapshot(2)
    snapshot = sim.snapshot()
    bigger = PolicyChoice(config=JobConfig.data_parallel(4), reason="grow")
    round_ = decide(snapshot, {job_id: bigger}, {}, honoured={}, policy_version="test")
    (decision,) = round_.decisions
    assert decision.config.world_size == 4
    sim.apply(round_.decisions)
    outcome = sim.advance()
    assert outcome.restarts == 1
    assert outcome.restart_s == pytest.approx(sim.config.restart_s)
    # Keeping it (no choice) decides nothing and costs nothing.
    keep = decide(sim.snapshot(), {}, {}, honoured={}, policy_version="test")
    assert keep.decisions == []
    assert sim.advance().restarts == 0


def test_a_new_config_that_finds_no_room_keeps_the_running_one() -> None:
    sim, job_id = _running_snapshot(2)
    snapshot = sim.snapshot()
    huge = PolicyChoice(config=JobConfig.data_parallel(64), reason="too big")
    round_ = decide(snapshot, {job_id: huge}, {}, honoured={}, policy_version="test")
    assert round_.decisions == []
    assert job_id in round_.declined
    assert "kept its configuration" in round_.declined[job_id]
    assert "needs 64 GPUs of one model" in round_.declined[job_id]  # declined before planning
    # One that fits the free GPUs but not this round's plan is declined after planning.
    sim2, other = _running_snapshot(2)
    eight = PolicyChoice(
        config=JobConfig(layout=Layout(world_size=8), global_batch=10**6),
        reason="fits no GPU's memory",
    )
    round2 = decide(sim2.snapshot(), {other: eight}, {}, honoured={}, policy_version="test")
    assert round2.decisions == []
    assert "kept its configuration" in round2.declined[other]


@pytest.mark.parametrize("policy_kind", ["learned", "rules"])
def test_two_hundred_active_jobs_never_fail_a_tick(database: Database, policy_kind: str) -> None:
    from autotune.policies.rules import RulesPolicy

    slots, ticks = 32, 6
    backend = SimulatedCluster(SimConfig(seed=4, initial_jobs=200, max_jobs=200))
    policy: LearnedPolicy | RulesPolicy
    if policy_kind == "learned":
        server = ScriptedServer(_actions(slots, ticks, 4))
        policy = LearnedPolicy(slots=slots, forecast=False, server=server)  # type: ignore[arg-type]
    else:
        policy = RulesPolicy()
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=policy))
    daemon.start()
    for _ in range(ticks):
        report = daemon.tick()  # raises if a tick fails
        snapshot = backend.snapshot()
        assert (
            len(snapshot.by_state("pending", "running")) + len(snapshot.by_state("finished")) == 200
        )
        running = {
            j.spec.job_id: j.placement
            for j in snapshot.by_state("running")
            if j.placement is not None
        }
        assert verify_placements([j.spec for j in snapshot.jobs], snapshot.nodes, running) == []
        # Every waiting job is told why.
        pending = {j.spec.job_id for j in snapshot.by_state("pending")}
        assert pending <= set(report.unplaced) | {d.job_id for d in report.decisions}
    if policy_kind == "learned":
        behind = [
            j
            for j in backend.snapshot().by_state("pending")
            if j not in slot_jobs(backend.snapshot(), slots)
        ]
        assert behind
        with database.session() as session:
            record = repo.get_job(session=session, job_id=behind[-1].spec.job_id)
        assert record is not None
        assert re.search(r"waiting: position \d+ in the queue", record.state_reason)


def test_a_slot_that_cannot_be_decoded_falls_back_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.policies import serving

    sim = SimulatedCluster(SimConfig(seed=1, initial_jobs=4, max_jobs=4))
    snapshot = sim.observe()
    broken = sorted(j.spec.job_id for j in snapshot.jobs)[1]
    real = serving.decode_slot

    def decode(entries, job, slot, **kw):  # type: ignore[no-untyped-def]
        if job.spec.job_id == broken:
            raise ValueError("no layout of this size")
        return real(entries, job, slot, **kw)

    monkeypatch.setattr(serving, "decode_slot", decode)
    action = np.ones(8 * len(ACTION_DIMS), dtype=np.int64)
    policy = LearnedPolicy(slots=8, forecast=False, server=ScriptedServer([action]))  # type: ignore[arg-type]
    choices = policy.decide(snapshot).choices
    assert choices[broken].source == "fallback"
    assert "ValueError: no layout of this size" in choices[broken].reason
    assert {c.source for k, c in choices.items() if k != broken} == {"policy"}


def test_energy_is_a_real_term_of_the_reward() -> None:
    rewards = {}
    for weight in (0.0, 1.0):
        env = ClusterEnv(slots=4, n_jobs=6, energy_weight=weight)
        env.reset(seed=1)
        env.action_space.seed(1)
        _, reward, *_, info = env.step(env.action_space.sample())
        rewards[weight] = (float(reward), info["energy_kwh"], info["reward_parts"]["energy"])
    (r0, kwh0, e0), (r1, kwh1, e1) = rewards[0.0], rewards[1.0]
    assert kwh0 == kwh1 > 0
    assert e0 == 0.0
    assert e1 == pytest.approx(-kwh1)
    assert r1 == pytest.approx(r0 - kwh1)


def test_training_episodes_use_the_energy_weight_setting() -> None:
    from dataclasses import asdict

    from autotune.core import DEFAULT_ENERGY_WEIGHT
    from autotune.policies.ppo import make_train_env
    from autotune.policies.ppo_settings import PPOSettings, TraceSource

    settings = PPOSettings(
        energy_weight=0.7, forecast=False, sources=(TraceSource(kind="stream", jobs=""),)
    )
    env = make_train_env(asdict(settings))
    assert env.current.config.energy_weight == 0.7
    assert env.current.config.stream
    assert PPOSettings().energy_weight == DEFAULT_ENERGY_WEIGHT


def test_training_samples_with_the_env_runners_and_vectors_asked_for() -> None:
    from autotune.policies.ppo import build_config
    from autotune.policies.ppo_settings import PPOSettings

    config = build_config(PPOSettings(env_runners=2, envs_per_runner=4))
    assert config.num_env_runners == 2
    assert config.num_envs_per_env_runner == 4
    default = build_config(PPOSettings())
    assert (default.num_env_runners, default.num_envs_per_env_runner) == (0, 1)
    with pytest.raises(ValueError, match="env_runners=-1"):
        PPOSettings(env_runners=-1)
    with pytest.raises(ValueError, match="envs_per_runner=0"):
        PPOSettings(envs_per_runner=0)


def test_every_job_gives_300_active_jobs_a_slot_each() -> None:
    """``every_job``: with 300 active jobs against 8 slots, the policy (shared across
    slots) sees and decides all 300, in one observation with a slot each; without it,
    the jobs behind the slots wait with their queue position."""
    sim = SimulatedCluster(SimConfig(seed=3, initial_jobs=300, max_jobs=300))
    snapshot = sim.observe()
    active = snapshot.queue_order()
    assert len(active) == 300
    width = len(ACTION_DIMS)
    for every_job, slots_seen in ((True, 300), (False, 8)):
        server = ScriptedServer([np.ones(slots_seen * width, dtype=np.int64)])
        policy = LearnedPolicy(slots=8, forecast=False, server=server, every_job=every_job)  # type: ignore[arg-type]
        decided = policy.decide(snapshot)
        (obs,) = server.seen
        assert obs.shape == (observation_size(slots_seen),)
        assert decided.acted is not None
        assert len(decided.acted.job_ids) == slots_seen
        waiting = [c for c in decided.choices.values() if "position" in c.reason]
        assert len(waiting) == 300 - slots_seen
        assert (
            sum(c.source == "policy" and c.config is not None for c in decided.choices.values())
            == slots_seen
        )
