"""The round period and a reconfiguration's cost in the observation: what the encoder
reads, what training draws, and logs written before the features existed."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import pytest
from helpers import cli

from autotune.envs.cluster_env import ClusterEnv
from autotune.policies.ppo import make_train_env
from autotune.policies.ppo_settings import PPOSettings
from autotune.rl.observation import (
    FEATURES,
    GLOBAL,
    HEADER,
    SLOT,
    ObservationEncoder,
    from_log,
    observation_size,
)

ROUND = next(i for i, name, _ in FEATURES if name == "round")
RESTART = next(i for i, name, _ in FEATURES if name == "restart")


def _restart(restart_s: float, round_s: float) -> float:
    return min(1.0, max(0.0, (math.log10(restart_s / round_s) + 2) / 4))


def test_the_observation_carries_the_round_and_the_restart_cost() -> None:
    env = ClusterEnv(small=True, slots=4, n_jobs=6, round_s=300.0, restart_s=30.0)
    obs, _ = env.reset(seed=0)
    assert obs[ROUND] == pytest.approx(math.log10(301) / 5)
    assert obs[RESTART] == pytest.approx(0.25)  # a tenth of a round
    snapshot = env.snapshot
    assert snapshot is not None
    # A backend that measures its restarts says so in the snapshot; the encoder takes it.
    ticks = ObservationEncoder(4, round_s=2.0)
    measured = ticks.encode(replace(snapshot, restart_s=8.0))
    assert measured[ROUND] == pytest.approx(math.log10(3) / 5)
    assert measured[RESTART] == pytest.approx(_restart(8.0, 2.0))
    assert measured[RESTART] > obs[RESTART]
    # Until it has measured one, the encoder's own figure; a free restart reads 0.
    assert ticks.encode(snapshot)[RESTART] == pytest.approx(_restart(30.0, 2.0))
    assert ObservationEncoder(4, round_s=300.0, restart_s=0.0).encode(snapshot)[RESTART] == 0.0
    with pytest.raises(ValueError, match="round_s"):
        ObservationEncoder(4, round_s=0.0)


def test_a_reset_may_set_the_episodes_restart_cost() -> None:
    env = ClusterEnv(small=True, slots=4, n_jobs=6, restart_s=30.0)
    obs, _ = env.reset(seed=1, options={"restart_s": 600.0})
    assert env.sim_config.restart_s == 600.0
    assert obs[RESTART] == pytest.approx(_restart(600.0, 300.0))
    with pytest.raises(ValueError, match="restart_s"):
        env.reset(seed=1, options={"restart_s": -1.0})


def test_training_draws_each_episodes_restart_cost_within_its_range() -> None:
    settings = PPOSettings(
        slots=4, max_steps=4, forecast=False, restart_s=5.0, restart_s_max=1500.0
    )
    env = make_train_env(asdict(settings))
    drawn = []
    for seed in range(12):
        obs, _ = env.reset(seed=seed)
        restart_s = env.current.sim_config.restart_s
        assert 5.0 <= restart_s <= 1500.0
        assert obs[RESTART] == pytest.approx(_restart(restart_s, 300.0), abs=1e-6)
        drawn.append(restart_s)
    assert len(set(drawn)) == len(drawn)
    assert min(drawn) < 30.0 < 300.0 < max(drawn)  # log-uniform: both ends reached
    again = make_train_env(asdict(settings))
    again.reset(seed=3)
    assert again.current.sim_config.restart_s == drawn[3]
    # Without a range every episode costs restart_s.
    fixed = make_train_env(asdict(replace(settings, restart_s=12.0, restart_s_max=None)))
    for seed in range(3):
        fixed.reset(seed=seed)
        assert fixed.current.sim_config.restart_s == 12.0
    with pytest.raises(ValueError, match="restart_s_max"):
        PPOSettings(restart_s=30.0, restart_s_max=10.0)
    refused = cli("train-policy", "--out", "x", "--restart-s", "30", "--restart-s-max", "10")
    assert refused.exit_code != 0
    assert "--restart-s-max" in refused.stderr


def test_a_log_written_before_the_features_reads_in_todays_layout() -> None:
    today = np.arange(observation_size(3), dtype=np.float32)
    assert np.array_equal(from_log(today, 3), today)
    # Before the tenant features: each slot two features short, read as no quota.
    width = len(SLOT)
    tenant = [HEADER + k * width + i for k in range(3) for i in (width - 2, width - 1)]
    no_tenants = np.delete(today, tenant)
    upgraded = from_log(no_tenants, 3)
    assert np.array_equal(np.delete(upgraded, tenant), no_tenants)
    assert upgraded[tenant].reshape(3, 2).tolist() == [[0.0, 0.5]] * 3
    assert [f.name for f in SLOT[-2:]] == ["tenant_quota", "tenant_headroom"]
    # Before the restart features too: the round and the restart cost come back as 0.
    old = np.delete(no_tenants, [ROUND, RESTART])
    upgraded = from_log(old, 3)
    assert upgraded[ROUND] == upgraded[RESTART] == 0.0
    assert np.array_equal(np.delete(upgraded, [ROUND, RESTART, *tenant]), old)
    assert upgraded[tenant].reshape(3, 2).tolist() == [[0.0, 0.5]] * 3
    assert (len(GLOBAL) - 2, len(GLOBAL) - 1) == (ROUND, RESTART)
    # A round with no job in its slots is padded to one slot.
    assert len(from_log(today[:HEADER], 0)) == HEADER + len(SLOT)
    assert from_log(np.delete(today[:HEADER], [ROUND, RESTART]), 0)[ROUND] == 0.0
