"""Off-policy estimates of a policy's value from logged decisions.

The unit is one job's decision in one round (``replay_spec``: the learned policy factorises
exactly over job slots). The estimand is the expected reward of that decision, over the
states the logs visited, had the target policy taken it:

    V(pi) = E_{s ~ logs} E_{a ~ pi(. | s)} [ r(s, a) ]

where ``r`` is the reward of the round after the decision. It is a ONE-STEP estimand: what a
decision does to later rounds (a restart that pays off after the next round, the queue it
leaves for other jobs, the states a different policy would have led to) is not credited. The
counterfactual simulation of the whole workload covers those effects; these estimates are
the check that needs no simulator, only the logs and the acting (behaviour) probabilities
logged with each decision.

Estimators (all on the same rows, with importance weights
``w_i = min(pi(a_i | s_i) / mu(a_i | s_i), max_weight)``, ``mu`` the logged behaviour):

- SNIS, per-decision self-normalised importance sampling: ``sum w r / sum w``.
- DR, doubly robust with a reward model ``q`` cross-fitted on two folds of episodes (each
  row is predicted by the model fitted on the other fold, so a row's own reward never
  enters its prediction): ``mean E_pi q(s_i) + sum w_i (r_i - q(s_i, a_i)) / sum w_i``. The
  correction term is self-normalised like SNIS (weighted DR): when the weights are heavy
  it trades a small bias for a much smaller variance, and with a target equal to the
  logging policy both forms agree.
- ESS, the effective sample size of the weights, ``(sum w)^2 / sum w^2``, and its share of
  the rows: how many rows the estimates really rest on.

Intervals are percentile bootstraps that resample whole episodes (one job's life), since
the decisions of one job are correlated; comparisons resample the same episodes for both
policies (paired), so their difference is measured far more precisely than either value.
The reward model is fitted once and held fixed across resamples.

Probabilities of a target policy are given per action entry, as
``autotune.policies.serving.entry_probabilities`` returns them: 7 arrays ``(N, n_d)``. The
probability of a logged action is the product over the entries that mattered (``mask``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.errors import InputError
from autotune.policies.replay.logged import (
    ENTRIES,
    LoggedDecisions,
    Weights,
    action_probability,
    check_probabilities,
    importance_weights,
)
from autotune.rl.action import ACTION_DIMS
from autotune.stats import percentile_interval

__all__ = [
    "Comparison",
    "CrossFit",
    "Estimate",
    "Paired",
    "PolicyValue",
    "RewardModel",
    "Verdict",
    "compare",
    "cross_fit",
    "policy_value",
    "verdict",
]

_OFFSETS = np.concatenate([[0], np.cumsum(ACTION_DIMS)]).astype(np.int64)
_BOOTSTRAP_CELLS = 4_000_000
"""Resamples x episodes drawn at once (memory of one block of resampling counts)."""


# --------------------------------------------------------------------------- reward model


def _one_hots(entries: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``(N, sum(ACTION_DIMS))`` one-hot of each entry's value, zero for entries that did
    not matter (a kept running job's configuration entries, a waiting job's ``change``)."""
    out = np.zeros((entries.shape[0], int(_OFFSETS[-1])))
    rows = np.arange(entries.shape[0])
    for d in range(ENTRIES):
        out[rows, _OFFSETS[d] + entries[:, d]] = mask[:, d]
    return out


@dataclass(frozen=True, eq=False)
class RewardModel:
    """A ridge regression of the reward on the observation and the action entries that
    mattered: ``q(s, a) = b + c . z(s) + sum_d m_d(a) theta_d[a_d]``, ``z`` the standardised
    observation, ``m_d`` the mask rule. Being linear in each entry's one-hot, its expectation
    under a factorised policy is exact from the per-entry probabilities (``expected``)."""

    intercept: float
    obs_mean: np.ndarray
    obs_scale: np.ndarray
    obs_coef: np.ndarray
    entry_coef: tuple[np.ndarray, ...]
    """One ``(n_d,)`` array per entry: theta_d."""

    @classmethod
    def fit(
        cls,
        obs: np.ndarray,
        entries: np.ndarray,
        mask: np.ndarray,
        rewards: np.ndarray,
        *,
        ridge: float = 1.0,
    ) -> RewardModel:
        """Closed-form ridge fit; the intercept is not penalised. ``ridge`` > 0 is needed:
        the ``change`` one-hots of running jobs sum to a running indicator, and the entry
        one-hots of waiting jobs to a constant, so the plain least-squares problem is
        singular."""
        if not ridge > 0:
            raise ValueError(f"ridge={ridge}: must be > 0")
        if obs.shape[0] == 0:
            raise InputError("no rows to fit the reward model on")
        mean = obs.mean(axis=0)
        scale = obs.std(axis=0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        x = np.hstack([np.ones((obs.shape[0], 1)), (obs - mean) / scale, _one_hots(entries, mask)])
        penalty = np.full(x.shape[1], float(ridge))
        penalty[0] = 0.0
        beta = np.linalg.solve(x.T @ x + np.diag(penalty), x.T @ rewards)
        d = obs.shape[1]
        theta = beta[1 + d :]
        return cls(
            intercept=float(beta[0]),
            obs_mean=mean,
            obs_scale=scale,
            obs_coef=beta[1 : 1 + d],
            entry_coef=tuple(theta[_OFFSETS[k] : _OFFSETS[k + 1]] for k in range(ENTRIES)),
        )

    def baseline(self, obs: np.ndarray) -> np.ndarray:
        """``(N,)`` the part of ``q`` that does not depend on the action."""
        return np.asarray(self.intercept + ((obs - self.obs_mean) / self.obs_scale) @ self.obs_coef)

    def predict(self, obs: np.ndarray, entries: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``(N,)`` q(s_i, a_i) for the given actions (entries and the mask they imply)."""
        out = self.baseline(obs)
        for d, theta in enumerate(self.entry_coef):
            out = out + np.where(mask[:, d], theta[entries[:, d]], 0.0)
        return out

    def expected(
        self, obs: np.ndarray, running: np.ndarray, probs: Sequence[np.ndarray]
    ) -> np.ndarray:
        """``(N,)`` E_{a ~ pi} q(s_i, a) for a policy whose entries are independent with
        the given per-entry probabilities. A running job that keeps (``change`` 0) uses only
        ``change``: ``pi(0) theta_0[0] + pi(1) (theta_0[1] + sum_{d>0} E_pi theta_d)``; a
        waiting job uses every entry but ``change``: ``sum_{d>0} E_pi theta_d``."""
        others = sum(
            (np.asarray(probs[d]) @ self.entry_coef[d] for d in range(1, ENTRIES)),
            start=np.zeros(obs.shape[0]),
        )
        change = np.asarray(probs[0])
        theta0 = self.entry_coef[0]
        on_running = change[:, 0] * theta0[0] + change[:, 1] * (theta0[1] + others)
        return self.baseline(obs) + np.where(running, on_running, others)


@dataclass(frozen=True, eq=False)
class CrossFit:
    """Two reward models, each fitted on one fold of episodes and used on the other."""

    fold: np.ndarray
    """``(N,)`` 0 or 1: each row's fold; row i is predicted by ``models[1 - fold[i]]``."""
    models: tuple[RewardModel, RewardModel]

    def predict(self, data: LoggedDecisions) -> np.ndarray:
        """``(N,)`` q(s_i, a_i) of the logged actions, out of fold."""
        out = np.empty(data.rows)
        for k in (0, 1):
            rows = self.fold == k
            out[rows] = self.models[1 - k].predict(
                data.obs[rows], data.entries[rows], data.mask[rows]
            )
        return out

    def expected(self, data: LoggedDecisions, probs: Sequence[np.ndarray]) -> np.ndarray:
        """``(N,)`` E_{a ~ pi} q(s_i, a), out of fold."""
        checked = check_probabilities(probs, data.rows, "probabilities")
        out = np.empty(data.rows)
        for k in (0, 1):
            rows = self.fold == k
            out[rows] = self.models[1 - k].expected(
                data.obs[rows], data.running[rows], [p[rows] for p in checked]
            )
        return out


def cross_fit(data: LoggedDecisions, *, ridge: float = 1.0, seed: int = 0) -> CrossFit:
    """Split the episodes at random into two halves and fit a reward model on each."""
    if data.episodes < 2:
        raise InputError(
            f"{data.episodes} episode: the doubly robust estimate cross-fits its reward "
            "model on two folds of episodes and needs at least 2"
        )
    order = np.random.default_rng(seed).permutation(data.episodes)
    episode_fold = np.empty(data.episodes, dtype=np.int64)
    episode_fold[order] = np.arange(data.episodes) % 2
    fold = episode_fold[data.episode_index]
    models = tuple(
        RewardModel.fit(
            data.obs[fold == k],
            data.entries[fold == k],
            data.mask[fold == k],
            data.rewards[fold == k],
            ridge=ridge,
        )
        for k in (0, 1)
    )
    return CrossFit(fold=fold, models=(models[0], models[1]))


# --------------------------------------------------------------------------- estimates


def _json_number(value: float) -> float | None:
    """A float for JSON: NaN and infinities become null."""
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its bootstrap percentile interval at ``level``."""

    value: float
    low: float
    high: float
    level: float

    @property
    def width(self) -> float:
        """``high - low``."""
        return self.high - self.low

    def contains(self, value: float) -> bool:
        """Whether ``low <= value <= high``."""
        return self.low <= value <= self.high

    def to_json(self) -> dict[str, float | None]:
        """Plain numbers (null for an interval the bootstrap could not give)."""
        return {
            "value": _json_number(self.value),
            "low": _json_number(self.low),
            "high": _json_number(self.high),
            "level": self.level,
        }


@dataclass(frozen=True, eq=False)
class _Terms:
    """Per-episode sums of what the estimators of one policy add up (shape ``(E,)``
    each): with counts ``c`` of each episode in a resample, SNIS = c.wr / c.w and
    DR = c.eq / c.n + c.wres / c.w."""

    n: np.ndarray
    w: np.ndarray
    wr: np.ndarray
    eq: np.ndarray
    wres: np.ndarray

    @classmethod
    def of(
        cls, data: LoggedDecisions, weights: Weights, q_logged: np.ndarray, q_target: np.ndarray
    ) -> _Terms:
        def per_episode(x: np.ndarray) -> np.ndarray:
            return np.bincount(data.episode_index, weights=x, minlength=data.episodes)

        w = weights.values
        return cls(
            n=per_episode(np.ones(data.rows)),
            w=per_episode(w),
            wr=per_episode(w * data.rewards),
            eq=per_episode(q_target),
            wres=per_episode(w * (data.rewards - q_logged)),
        )

    def estimates(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """SNIS and DR for each row of ``counts`` ``(B, E)`` (NaN where the resample's
        weights sum to 0)."""
        w = counts @ self.w
        with np.errstate(divide="ignore", invalid="ignore"):
            snis = np.where(w > 0, (counts @ self.wr) / w, np.nan)
            dr = (counts @ self.eq) / (counts @ self.n) + np.where(
                w > 0, (counts @ self.wres) / w, np.nan
            )
        return snis, dr


def _resample_counts(episodes: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Blocks of bootstrap counts ``(b, E)``: how often each episode is drawn when
    ``episodes`` episodes are drawn with replacement, ``resamples`` rows in all."""
    rng = np.random.default_rng(seed)
    block = max(1, _BOOTSTRAP_CELLS // episodes)
    uniform = np.full(episodes, 1.0 / episodes)
    done = 0
    while done < resamples:
        b = min(block, resamples - done)
        yield rng.multinomial(episodes, uniform, size=b).astype(np.float64)
        done += b


def _check_settings(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: must be >= 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: must be in (0, 1)")


def _bootstrap(
    terms: Sequence[_Terms], episodes: int, resamples: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Resampled (SNIS, DR) of each policy, ``(resamples,)`` each, on the SAME resamples."""
    parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in terms]
    for counts in _resample_counts(episodes, resamples, seed):
        for k, t in enumerate(terms):
            parts[k].append(t.estimates(counts))
    return [
        (np.concatenate([p[0] for p in part]), np.concatenate([p[1] for p in part]))
        for part in parts
    ]


def _point(terms: _Terms) -> tuple[float, float]:
    snis, dr = terms.estimates(np.ones((1, len(terms.n))))
    return float(snis[0]), float(dr[0])


def _seeds(seed: int) -> tuple[int, int]:
    """Independent seeds for the folds and the bootstrap."""
    folds, boot = np.random.SeedSequence(seed).generate_state(2)
    return int(folds), int(boot)


def _target_terms(
    data: LoggedDecisions, probs: Sequence[np.ndarray], fit: CrossFit, max_weight: float
) -> tuple[_Terms, Weights]:
    weights = importance_weights(data, probs, max_weight=max_weight)
    if not weights.values.sum() > 0:
        raise InputError(
            "the target policy gives probability 0 to every logged action: the logs say "
            "nothing about it"
        )
    terms = _Terms.of(data, weights, fit.predict(data), fit.expected(data, probs))
    return terms, weights


@dataclass(frozen=True)
class PolicyValue:
    """Off-policy estimates of one target policy's expected reward per decision."""

    snis: Estimate
    dr: Estimate
    ess: float
    ess_share: float
    clipped_share: float
    max_weight: float
    rows: int
    episodes: int
    logged_mean_reward: float
    """The on-policy mean reward of the logs, for reference."""
    resamples: int

    def to_json(self) -> dict[str, Any]:
        """Plain dicts and numbers."""
        return {
            "snis": self.snis.to_json(),
            "dr": self.dr.to_json(),
            "ess": _json_number(self.ess),
            "ess_share": _json_number(self.ess_share),
            "clipped_share": self.clipped_share,
            "max_weight": self.max_weight,
            "rows": self.rows,
            "episodes": self.episodes,
            "logged_mean_reward": self.logged_mean_reward,
            "resamples": self.resamples,
        }


def policy_value(
    data: LoggedDecisions,
    target_probs: Sequence[np.ndarray],
    *,
    max_weight: float = 50.0,
    ridge: float = 1.0,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> PolicyValue:
    """SNIS and DR estimates, with episode-bootstrap intervals, of a target policy given
    by its per-entry probabilities on the logged rows (``entry_probabilities``)."""
    _check_settings(resamples, level)
    fold_seed, boot_seed = _seeds(seed)
    fit = cross_fit(data, ridge=ridge, seed=fold_seed)
    terms, weights = _target_terms(data, target_probs, fit, max_weight)
    snis, dr = _point(terms)
    ((snis_boot, dr_boot),) = _bootstrap([terms], data.episodes, resamples, boot_seed)
    return PolicyValue(
        snis=Estimate(snis, *percentile_interval(snis_boot, level), level=level),
        dr=Estimate(dr, *percentile_interval(dr_boot, level), level=level),
        ess=weights.ess,
        ess_share=weights.ess_share,
        clipped_share=weights.clipped_share,
        max_weight=weights.max_weight,
        rows=data.rows,
        episodes=data.episodes,
        logged_mean_reward=data.mean_reward,
        resamples=resamples,
    )


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Paired:
    """One estimator's value of the candidate and of the logging policy, and their
    difference (candidate - logging) with a paired bootstrap interval."""

    candidate: Estimate
    logging: Estimate
    difference: Estimate

    def to_json(self) -> dict[str, Any]:
        """Plain dicts and numbers."""
        return {
            "candidate": self.candidate.to_json(),
            "logging": self.logging.to_json(),
            "difference": self.difference.to_json(),
        }


@dataclass(frozen=True)
class Verdict:
    """Whether to promote the candidate, and, if not, each test it failed, in words."""

    promote: bool
    failed: tuple[str, ...]
    summary: str

    def to_json(self) -> dict[str, Any]:
        """Plain dicts and strings."""
        return {"promote": self.promote, "failed": list(self.failed), "summary": self.summary}


def _bound_test(name: str, difference: Estimate) -> str | None:
    """Why the difference's lower bound does not clear 0, or None when it does."""
    pct = f"{difference.level:.0%}"
    if not math.isfinite(difference.low):
        return f"{name}: no {pct} interval for the difference (every resample failed)"
    if difference.low > 0:
        return None
    return (
        f"{name}: the lower {pct} bound of the difference (candidate - logging) is "
        f"{difference.low:+.4g}, not above 0 (difference {difference.value:+.4g}, {pct} "
        f"interval [{difference.low:+.4g}, {difference.high:+.4g}])"
    )


def verdict(
    snis_difference: Estimate,
    dr_difference: Estimate,
    ess: float,
    rows: int,
    *,
    min_ess_share: float = 0.1,
) -> Verdict:
    """Promote only if the lower bound of the difference (candidate - logging) is above 0
    under both SNIS and DR, and the candidate's ESS is at least ``min_ess_share`` of the
    rows (otherwise the estimates rest on too few rows to trust, whatever they say)."""
    if not 0.0 <= min_ess_share <= 1.0:
        raise ValueError(f"min_ess_share={min_ess_share}: must be in [0, 1]")
    failed = [
        reason
        for reason in (
            _bound_test("SNIS", snis_difference),
            _bound_test("DR", dr_difference),
        )
        if reason is not None
    ]
    share = ess / rows if rows else 0.0
    if share < min_ess_share:
        failed.append(
            f"ESS: {ess:.1f} effective rows of {rows} ({share:.1%}), below the required "
            f"{min_ess_share:.0%}: the candidate differs from the logging policy in too "
            "many decisions for the logs to judge it"
        )
    if failed:
        summary = "keep the logging policy: " + "; ".join(failed)
    else:
        pct = f"{snis_difference.level:.0%}"
        summary = (
            f"promote: the candidate is better under SNIS ({snis_difference.value:+.4g}, "
            f"{pct} [{snis_difference.low:+.4g}, {snis_difference.high:+.4g}]) and DR "
            f"({dr_difference.value:+.4g}, {pct} [{dr_difference.low:+.4g}, "
            f"{dr_difference.high:+.4g}]), ESS {ess:.1f} of {rows} rows ({share:.1%})"
        )
    return Verdict(promote=not failed, failed=tuple(failed), summary=summary)


@dataclass(frozen=True)
class Comparison:
    """A candidate policy against the logging policy on the same logs."""

    snis: Paired
    dr: Paired
    ess: float
    """The candidate's effective sample size."""
    ess_share: float
    clipped_share: float
    """Share of rows whose candidate weight was clipped at ``max_weight``."""
    logging_mismatch_share: float
    """Share of rows where ``logging_probs`` give the logged action another probability
    than the one logged (more than 1e-6 apart in log): 0 when they reproduce the behaviour
    exactly; otherwise the logging value is itself an off-policy estimate (several policy
    versions or epsilons in the logs)."""
    max_weight: float
    rows: int
    episodes: int
    logged_mean_reward: float
    resamples: int
    min_ess_share: float
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        """Plain dicts, lists, numbers and strings (``json.dumps`` takes it as is)."""
        return {
            "snis": self.snis.to_json(),
            "dr": self.dr.to_json(),
            "ess": _json_number(self.ess),
            "ess_share": _json_number(self.ess_share),
            "clipped_share": self.clipped_share,
            "logging_mismatch_share": self.logging_mismatch_share,
            "max_weight": self.max_weight,
            "rows": self.rows,
            "episodes": self.episodes,
            "logged_mean_reward": self.logged_mean_reward,
            "resamples": self.resamples,
            "min_ess_share": self.min_ess_share,
            "verdict": self.verdict.to_json(),
        }


def compare(
    data: LoggedDecisions,
    candidate_probs: Sequence[np.ndarray],
    logging_probs: Sequence[np.ndarray],
    *,
    max_weight: float = 50.0,
    ridge: float = 1.0,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    min_ess_share: float = 0.1,
) -> Comparison:
    """Estimate the candidate and the logging policy (both as per-entry probabilities on
    the logged rows) with SNIS and DR, the same reward model and the same bootstrap
    resamples, and decide whether the candidate is better (``verdict``)."""
    _check_settings(resamples, level)
    fold_seed, boot_seed = _seeds(seed)
    fit = cross_fit(data, ridge=ridge, seed=fold_seed)
    cand_terms, cand_weights = _target_terms(data, candidate_probs, fit, max_weight)
    log_terms, _ = _target_terms(data, logging_probs, fit, max_weight)
    with np.errstate(divide="ignore"):
        log_logging = np.log(action_probability(data, logging_probs))
    mismatch = float((np.abs(log_logging - data.behaviour_logp) > 1e-6).mean())
    (c_snis, c_dr), (l_snis, l_dr) = _point(cand_terms), _point(log_terms)
    (cs, cd), (ls, ld) = _bootstrap([cand_terms, log_terms], data.episodes, resamples, boot_seed)

    def paired(cand: float, logg: float, cand_boot: np.ndarray, log_boot: np.ndarray) -> Paired:
        return Paired(
            candidate=Estimate(cand, *percentile_interval(cand_boot, level), level=level),
            logging=Estimate(logg, *percentile_interval(log_boot, level), level=level),
            difference=Estimate(
                cand - logg, *percentile_interval(cand_boot - log_boot, level), level
            ),
        )

    snis = paired(c_snis, l_snis, cs, ls)
    dr = paired(c_dr, l_dr, cd, ld)
    return Comparison(
        snis=snis,
        dr=dr,
        ess=cand_weights.ess,
        ess_share=cand_weights.ess_share,
        clipped_share=cand_weights.clipped_share,
        logging_mismatch_share=mismatch,
        max_weight=cand_weights.max_weight,
        rows=data.rows,
        episodes=data.episodes,
        logged_mean_reward=data.mean_reward,
        resamples=resamples,
        min_ess_share=min_ess_share,
        verdict=verdict(
            snis.difference, dr.difference, cand_weights.ess, data.rows, min_ess_share=min_ess_share
        ),
    )
