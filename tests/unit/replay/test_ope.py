"""Off-policy estimates on synthetic logs: a contextual bandit with the policy's 7-entry
factored actions, the mask rule of running and waiting jobs, epsilon-greedy policies and a
known reward, so every estimate can be checked against the truth."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autotune.errors import InputError
from autotune.policies.replay.logged import LoggedDecisions, action_probability, importance_weights
from autotune.policies.replay.ope import RewardModel, compare, cross_fit, policy_value
from autotune.rl.acting import action_mask, entry_probabilities, logged_logp
from autotune.rl.action import ACTION_DIMS

D = 6
OFFSETS = np.concatenate([[0], np.cumsum(ACTION_DIMS)])
THETA = [np.linspace(0.0, 0.6, n) * (1.0 if d % 2 else -1.0) for d, n in enumerate(ACTION_DIMS)]
"""The true effect of each entry's value (when the entry matters): the best value of an
even entry is its first, of an odd entry its last."""
COEF = np.linspace(-0.5, 0.5, D)
W_LOGGING = np.random.default_rng(1).standard_normal((D, sum(ACTION_DIMS)))
W_TARGET = np.random.default_rng(2).standard_normal((D, sum(ACTION_DIMS)))


def states(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations and which jobs are running (60%)."""
    return rng.random((n, D)), rng.random(n) < 0.6


def sample(rng: np.random.Generator, probs: list[np.ndarray]) -> np.ndarray:
    """One action per row, each entry drawn from its probabilities."""
    n = probs[0].shape[0]
    out = np.empty((n, len(probs)), dtype=np.int64)
    for d, p in enumerate(probs):
        drawn = (rng.random((n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
        out[:, d] = np.minimum(drawn, p.shape[1] - 1)
    return out


def mean_reward(obs: np.ndarray, entries: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The expected reward: linear in the state and the entries that mattered, plus an
    interaction of state and GPU count that a linear reward model cannot capture."""
    reward = obs @ COEF
    for d in range(len(ACTION_DIMS)):
        reward = reward + np.where(mask[:, d], THETA[d][entries[:, d]], 0.0)
    return np.asarray(reward + 0.8 * obs[:, 0] * ((entries[:, 3] >= 4) & mask[:, 3]))


def logits(obs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.asarray(obs @ weights)


def best(d: int) -> int:
    """The best value of entry ``d`` (``THETA``)."""
    return ACTION_DIMS[d] - 1 if d % 2 else 0


def worst(d: int) -> int:
    return 0 if d % 2 else ACTION_DIMS[d] - 1


def forced_logits(obs: np.ndarray, values: dict[int, int]) -> np.ndarray:
    """The logging policy's logits, with entry ``d``'s greedy value set to ``values[d]``."""
    out = logits(obs, W_LOGGING)
    for d, value in values.items():
        block = np.zeros(ACTION_DIMS[d])
        block[value] = 100.0
        out[:, OFFSETS[d] : OFFSETS[d + 1]] = block
    return out


def bandit(
    seed: int,
    *,
    eps: float = 0.3,
    episodes: int = 200,
    per_episode: int = 15,
    noise: float = 0.5,
    episode_sd: float = 0.3,
) -> LoggedDecisions:
    """Logs of the epsilon-greedy logging policy: ``episodes`` episodes (jobs) of
    ``per_episode`` decisions, each episode with its own reward offset (correlated rows)."""
    rng = np.random.default_rng(seed)
    n = episodes * per_episode
    obs, running = states(rng, n)
    probs = entry_probabilities(logits(obs, W_LOGGING), eps)
    entries = sample(rng, probs)
    mask = action_mask(entries, running)
    logp_dims, _ = logged_logp(probs, entries, mask)
    episode = np.repeat(np.arange(episodes), per_episode)
    offset = episode_sd * rng.standard_normal(episodes)[episode]
    rewards = mean_reward(obs, entries, mask) + offset + noise * rng.standard_normal(n)
    return LoggedDecisions(
        episode=episode,
        obs=obs,
        entries=entries,
        mask=mask,
        running=running,
        logp_dims=logp_dims,
        rewards=rewards,
    )


def true_value(
    policy_logits: Callable[[np.ndarray], np.ndarray], eps: float, n: int = 300_000
) -> float:
    """Monte Carlo value of a policy over the state distribution (fresh states, actions
    drawn from the policy, the expected reward): standard error about 0.001."""
    rng = np.random.default_rng(99)
    obs, running = states(rng, n)
    entries = sample(rng, entry_probabilities(policy_logits(obs), eps))
    return float(mean_reward(obs, entries, action_mask(entries, running)).mean())


def with_episodes(data: LoggedDecisions, episode: Any) -> LoggedDecisions:
    return LoggedDecisions(
        episode=episode,
        obs=data.obs,
        entries=data.entries,
        mask=data.mask,
        running=data.running,
        logp_dims=data.logp_dims,
        rewards=data.rewards,
    )


def logging_probs(data: LoggedDecisions, eps: float = 0.3) -> list[np.ndarray]:
    return entry_probabilities(logits(data.obs, W_LOGGING), eps)


# ---------------------------------------------------------------- (a) the logging policy


def test_the_logging_policy_is_estimated_at_the_logged_mean_reward() -> None:
    data = bandit(0)
    value = policy_value(data, logging_probs(data))
    # Every weight is 1: SNIS is the logged mean, the ESS every row.
    assert value.snis.value == pytest.approx(data.mean_reward, rel=1e-12, abs=1e-12)
    assert value.ess_share == pytest.approx(1.0, rel=1e-12)
    assert value.clipped_share == 0.0
    assert value.snis.contains(data.mean_reward)
    # DR adds the reward model's mean-zero error (E_mu q - q(a)), well inside its interval.
    assert value.dr.contains(data.mean_reward)
    assert abs(value.dr.value - data.mean_reward) < value.dr.width / 4


def test_the_logging_policy_against_itself_differs_by_exactly_zero_and_is_not_promoted() -> None:
    data = bandit(0)
    probs = logging_probs(data)
    result = compare(data, probs, probs, resamples=200)
    for paired in (result.snis, result.dr):
        assert paired.difference.value == 0.0
        assert (paired.difference.low, paired.difference.high) == (0.0, 0.0)
    assert result.logging_mismatch_share == 0.0
    assert not result.verdict.promote
    assert [reason.split(":")[0] for reason in result.verdict.failed] == ["SNIS", "DR"]


# ---------------------------------------------------------------- (b) a known target value


def test_the_true_value_of_another_policy_lies_in_both_intervals() -> None:
    truth = true_value(lambda obs: logits(obs, W_TARGET), 0.3)
    logged = true_value(lambda obs: logits(obs, W_LOGGING), 0.3)
    data = bandit(3)
    value = policy_value(data, entry_probabilities(logits(data.obs, W_TARGET), 0.3))
    assert abs(truth - logged) > 0.05  # the target is a different policy
    assert value.snis.contains(truth), (truth, value.snis)
    assert value.dr.contains(truth), (truth, value.dr)
    assert value.dr.width < value.snis.width


def test_the_intervals_cover_the_truth_and_doubly_robust_is_narrower() -> None:
    """Over 30 independent logs: both 95% intervals cover the true value in most of them,
    and the reward model (right in its main effects, blind to one interaction) makes DR's
    interval narrower than SNIS's on average (about 0.75 of its width here)."""
    truth = true_value(lambda obs: logits(obs, W_TARGET), 0.3)
    covered = {"snis": 0, "dr": 0}
    widths: dict[str, list[float]] = {"snis": [], "dr": []}
    runs = 30
    for seed in range(runs):
        data = bandit(100 + seed, episodes=120)
        value = policy_value(
            data, entry_probabilities(logits(data.obs, W_TARGET), 0.3), resamples=300, seed=seed
        )
        for name, estimate in (("snis", value.snis), ("dr", value.dr)):
            covered[name] += estimate.contains(truth)
            widths[name].append(estimate.width)
    assert covered["snis"] >= 0.8 * runs, covered
    assert covered["dr"] >= 0.8 * runs, covered
    assert np.mean(widths["dr"]) < 0.9 * np.mean(widths["snis"]), widths


def test_the_reward_models_expectation_is_exact_over_every_joint_action() -> None:
    """E_pi q from the per-entry probabilities equals the sum over all 10080 joint actions
    of pi(a) q(s, a), for running and waiting jobs (the mask rule decides which entries
    count)."""
    data = bandit(5, episodes=20)
    model = RewardModel.fit(data.obs, data.entries, data.mask, data.rewards, ridge=1.0)
    rows = [0, 1, 2, 3, 4, 5]
    obs = data.obs[rows]
    running = np.array([True, True, True, False, False, False])
    probs = entry_probabilities(logits(obs, W_TARGET), 0.4)
    joint = np.array(list(itertools.product(*(range(n) for n in ACTION_DIMS))))
    for i in range(len(rows)):
        states_i = np.repeat(obs[i : i + 1], len(joint), axis=0)
        mask = action_mask(joint, np.full(len(joint), running[i]))
        q = model.predict(states_i, joint, mask)
        pi = np.prod([probs[d][i, joint[:, d]] for d in range(len(ACTION_DIMS))], axis=0)
        exact = float(pi @ q)
        fast = model.expected(obs[i : i + 1], running[i : i + 1], [p[i : i + 1] for p in probs])
        assert fast[0] == pytest.approx(exact, rel=1e-9, abs=1e-12)


def test_each_row_is_predicted_by_the_model_of_the_other_fold() -> None:
    data = bandit(6, episodes=40)
    fit = cross_fit(data, seed=1)
    for episode in range(data.episodes):
        assert len(set(fit.fold[data.episode_index == episode])) == 1  # folds split episodes
    assert 0.3 < fit.fold.mean() < 0.7
    first = fit.fold == 0
    own = fit.models[1].predict(data.obs[first], data.entries[first], data.mask[first])
    np.testing.assert_allclose(fit.predict(data)[first], own)


# ---------------------------------------------------------------- (c) the verdict


def test_a_clearly_better_candidate_on_enough_data_is_promoted() -> None:
    """The candidate takes the best ``change`` and ``checkpointing`` values; the rest as
    the logging policy: 0.22 better per decision."""
    data = bandit(5, eps=0.2, episodes=300, per_episode=20)

    def candidate(obs: np.ndarray) -> np.ndarray:
        return forced_logits(obs, {0: best(0), 6: best(6)})

    gain = true_value(candidate, 0.2) - true_value(lambda o: logits(o, W_LOGGING), 0.2)
    result = compare(
        data, entry_probabilities(candidate(data.obs), 0.2), logging_probs(data, 0.2), seed=1
    )
    assert result.verdict.promote, result.verdict.summary
    assert result.verdict.failed == ()
    assert result.verdict.summary.startswith("promote")
    assert result.ess_share >= 0.1
    assert result.snis.difference.contains(gain), (gain, result.snis.difference)
    assert result.dr.difference.contains(gain), (gain, result.dr.difference)
    assert json.loads(json.dumps(result.to_json(), allow_nan=False))["verdict"]["promote"]


def test_a_candidate_that_differs_in_nearly_every_decision_fails_the_ess_test() -> None:
    """The candidate's greedy values are the logging policy's least likely ones: the logs
    hold few of its decisions, whatever the bounds say."""
    data = bandit(5, eps=0.2, episodes=300, per_episode=20)
    candidate = entry_probabilities(-logits(data.obs, W_LOGGING), 0.05)
    result = compare(data, candidate, logging_probs(data, 0.2), seed=1)
    assert result.ess_share < 0.1
    assert not result.verdict.promote
    ess_reasons = [reason for reason in result.verdict.failed if reason.startswith("ESS")]
    assert len(ess_reasons) == 1
    # Both bounds clear 0 here (the opposite greedy values happen to be better): the ESS
    # test alone keeps the candidate out, since its estimates rest on 5% of the rows.
    assert result.verdict.failed == tuple(ess_reasons)
    assert f"{result.ess:.1f} effective rows of {data.rows}" in ess_reasons[0]
    assert "below the required 10%" in result.verdict.summary
    assert result.verdict.summary.startswith("keep the logging policy")


def test_a_worse_candidate_fails_both_bound_tests_with_its_numbers() -> None:
    data = bandit(5, eps=0.2, episodes=300, per_episode=20)
    worse = forced_logits(data.obs, {0: worst(0), 6: worst(6)})
    result = compare(data, entry_probabilities(worse, 0.2), logging_probs(data, 0.2), seed=1)
    assert not result.verdict.promote
    names = [reason.split(":")[0] for reason in result.verdict.failed]
    assert names[:2] == ["SNIS", "DR"]
    assert f"{result.snis.difference.low:+.4g}" in result.verdict.failed[0]
    assert f"{result.dr.difference.low:+.4g}" in result.verdict.failed[1]


# ---------------------------------------------------------------- (d) the bootstrap unit


def test_the_bootstrap_resamples_whole_episodes() -> None:
    """With a strong per-episode reward offset, resampling episodes gives a much wider
    interval than resampling rows as if they were independent; without one, about the
    same."""
    for episode_sd, low, high in ((1.0, 2.5, 6.0), (0.0, 0.75, 1.35)):
        data = bandit(7, episodes=100, per_episode=20, noise=0.3, episode_sd=episode_sd)
        rows = with_episodes(data, np.arange(data.rows))
        by_episode = policy_value(data, logging_probs(data), resamples=500)
        by_row = policy_value(rows, logging_probs(data), resamples=500)
        assert (data.episodes, rows.episodes) == (100, data.rows)
        for a, b in ((by_episode.snis, by_row.snis), (by_episode.dr, by_row.dr)):
            assert low < a.width / b.width < high, (episode_sd, a, b)


def test_episode_ids_may_be_any_hashable_and_the_estimates_are_reproducible() -> None:
    data = bandit(8, episodes=30)
    named = with_episodes(data, np.array([f"ep/{e}" for e in data.episode_index]))
    tuples = with_episodes(data, [("daemon", int(e)) for e in data.episode_index])
    probs = entry_probabilities(logits(data.obs, W_TARGET), 0.3)
    values = [policy_value(d, probs, resamples=200, seed=4) for d in (data, named, tuples)]
    assert tuples.episodes == named.episodes == data.episodes == 30
    assert values[0] == policy_value(data, probs, resamples=200, seed=4)
    assert values[0].dr.value == values[1].dr.value == values[2].dr.value


# ---------------------------------------------------------------- tables and JSON


def to_table(data: LoggedDecisions) -> pa.Table:
    def fixed(array: np.ndarray, kind: pa.DataType) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1), kind), array.shape[1])

    return pa.table(
        {
            "obs": fixed(data.obs.astype(np.float32), pa.float32()),
            "actions": fixed(data.entries, pa.int64()),
            "action_mask": fixed(data.mask, pa.bool_()),
            "action_logp_dims": fixed(data.logp_dims, pa.float64()),
            "rewards": pa.array(data.rewards),
            "eps_id": pa.array([f"e1/job-{e}" for e in data.episode_index]),
            "t": pa.array(np.arange(data.rows)),
        }
    )


def assert_same_rows(a: LoggedDecisions, b: LoggedDecisions) -> None:
    np.testing.assert_allclose(a.obs, b.obs, rtol=1e-6)
    for name in ("entries", "mask", "running", "logp_dims", "rewards", "episode_index"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_logs_load_from_an_arrow_table_a_data_frame_and_an_export(tmp_path: Path) -> None:
    data = bandit(9, episodes=10)
    table = to_table(data)
    from_arrow = LoggedDecisions.from_table(table)
    assert_same_rows(from_arrow, data)
    # running is the first mask entry (change mattered only for running jobs)
    np.testing.assert_array_equal(from_arrow.running, data.running)
    assert_same_rows(LoggedDecisions.from_table(table.to_pandas()), data)
    half = data.rows // 2
    pq.write_table(table.slice(0, half), tmp_path / "transitions-00000.parquet")
    pq.write_table(table.slice(half), tmp_path / "transitions-00001.parquet")
    assert_same_rows(LoggedDecisions.from_export(tmp_path), data)


def test_results_are_plain_json() -> None:
    data = bandit(10, episodes=30)
    probs = entry_probabilities(logits(data.obs, W_TARGET), 0.3)
    value = json.loads(
        json.dumps(policy_value(data, probs, resamples=100).to_json(), allow_nan=False)
    )
    assert set(value) >= {"snis", "dr", "ess", "ess_share", "clipped_share", "rows"}
    assert set(value["dr"]) == {"value", "low", "high", "level"}
    result = compare(data, probs, logging_probs(data), resamples=100).to_json()
    text = json.dumps(result, allow_nan=False)
    assert json.loads(text)["snis"]["difference"]["value"] == result["snis"]["difference"]["value"]
    assert isinstance(result["verdict"]["failed"], list)


def test_weights_are_clipped_and_the_share_reported() -> None:
    data = bandit(11, episodes=30)
    probs = entry_probabilities(-logits(data.obs, W_LOGGING), 0.0)
    raw = action_probability(data, probs) / np.exp(data.behaviour_logp)
    weights = importance_weights(data, probs, max_weight=3.0)
    assert weights.values.max() == 3.0
    assert weights.clipped_share == pytest.approx(float((raw > 3.0).mean()))
    assert 0 < weights.clipped_share < 1


# ---------------------------------------------------------------- (e) errors


def test_bad_logs_are_refused_with_a_clear_error() -> None:
    data = bandit(12, episodes=10)
    fields = {
        "episode": data.episode,
        "obs": data.obs,
        "entries": data.entries,
        "mask": data.mask,
        "running": data.running,
        "logp_dims": data.logp_dims,
        "rewards": data.rewards,
    }
    empty = {k: v[:0] for k, v in fields.items()}
    with pytest.raises(InputError, match="no logged decisions"):
        LoggedDecisions(**empty)
    with pytest.raises(InputError, match=r"rewards of shape \(149,\)"):
        LoggedDecisions(**{**fields, "rewards": data.rewards[:-1]})
    with pytest.raises(InputError, match=r"entries of shape"):
        LoggedDecisions(**{**fields, "entries": data.entries[:, :6]})
    zero = data.logp_dims.copy()
    zero[3, 0] = -np.inf
    with pytest.raises(InputError, match="row 3: zero behaviour probability"):
        LoggedDecisions(**{**fields, "logp_dims": zero})
    wrong_mask = data.mask.copy()
    wrong_mask[~data.running, 0] = True  # change never matters for a waiting job
    with pytest.raises(InputError, match="does not follow the rule"):
        LoggedDecisions(**{**fields, "mask": wrong_mask, "running": wrong_mask[:, 0]})
    with pytest.raises(InputError, match=r"running != mask"):
        LoggedDecisions(**{**fields, "running": ~data.running})
    with pytest.raises(InputError, match="column 'action_logp_dims': missing column"):
        LoggedDecisions.from_table(to_table(data).drop_columns(["action_logp_dims"]))
    with pytest.raises(InputError, match="missing column"):
        LoggedDecisions.from_table(pd.DataFrame({"obs": [[0.0] * D]}))


def test_bad_probabilities_and_settings_are_refused() -> None:
    data = bandit(13, episodes=10)
    probs = logging_probs(data)
    off = [p.copy() for p in probs]
    off[3][7] *= 0.5
    with pytest.raises(InputError, match=r"probabilities\[3\] row 7: probabilities sum to"):
        policy_value(data, off)
    with pytest.raises(InputError, match="6 arrays, expected one per entry"):
        policy_value(data, probs[:6])
    with pytest.raises(InputError, match=r"shape \(149, 6\): expected \(150, 6\)"):
        policy_value(data, [probs[0], probs[1][1:], *probs[2:]])
    negative = [p.copy() for p in probs]
    negative[0][0] = [1.5, -0.5]
    with pytest.raises(InputError, match="finite and >= 0"):
        compare(data, probs, negative)
    # A kept running job used only `change`: the target always changes; every other row
    # used `compression`: the target never takes the logged one.
    never = [p.copy() for p in probs]
    never[0][data.running & (data.entries[:, 0] == 0)] = [0.0, 1.0]
    never[1][:] = 0.0
    never[1][np.arange(data.rows), (data.entries[:, 1] + 1) % ACTION_DIMS[1]] = 1.0
    with pytest.raises(InputError, match="probability 0 to every logged action"):
        policy_value(data, never)
    one_episode = with_episodes(data, np.zeros(data.rows, dtype=int))
    with pytest.raises(InputError, match="needs at least 2"):
        policy_value(one_episode, probs)
    with pytest.raises(ValueError, match="max_weight"):
        policy_value(data, probs, max_weight=0.0)
    with pytest.raises(ValueError, match="level"):
        policy_value(data, probs, level=1.0)
