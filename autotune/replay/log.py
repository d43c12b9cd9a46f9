"""The transition log: what offline learning needs of every decision round the learned
policy takes in the daemon (``autotune replay export`` reads it back). The command line
hands one to the daemon (``DaemonParts.transitions``, the loop's ``Recorder``).

Each tick the acting policy decides, one ``transitions`` row is written in the same
transaction as the round's decisions: the encoded observation, per acted slot the job,
whether it ran, the entries taken, which of them mattered, their log-probabilities under
the acting (epsilon-greedy) policy, and whether the policy's choice is what the round
applied (an override or a fallback decision replaces it). The next tick, once the backend
has run the round, fills in the reward: the environment's reward of the round
(``autotune.envs.cluster_env.reward``) and each job's own part (``job_rewards``), and which
jobs ended. Rounds are grouped into episodes of ``episode_rounds`` consecutive rounds of
one daemon run; a daemon that stops leaves its last round truncated.

Backends that do not report a round's outcome (``SimulatedTime.run_round``: the simulated
cluster does) leave the reward empty; such rounds are not exported.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from autotune.catalog.applications import catalog_coefficients
from autotune.core import ACTIVE_STATES, DEFAULT_ENERGY_WEIGHT, DEFAULT_ROUND_S, Decision, utc_now
from autotune.daemon.log import event
from autotune.db import repository as repo
from autotune.decision.step import DecisionRound
from autotune.interfaces import ClusterSnapshot
from autotune.perf.model import estimate, shape_of, statistical_efficiency
from autotune.perf.stragglers import median_cv
from autotune.rl.acting import ActedStep
from autotune.rl.observation import HEADER, SLOT
from autotune.rl.reward import RewardWeights, RoundOutcome, job_rewards, reward

__all__ = ["DEFAULT_EPISODE_ROUNDS", "TransitionLog"]

DEFAULT_EPISODE_ROUNDS = 288
"""Rounds per logged episode: a day of 5-minute rounds."""


@dataclass(slots=True)
class _Open:
    """The newest logged round, waiting for the next tick's measurement of it."""

    transition_id: int
    job_ids: tuple[str, ...]
    last_of_episode: bool
    time_s: float
    """The backend's clock at the decision."""


class TransitionLog:
    """Writes the daemon's transitions (see the module docstring)."""

    def __init__(
        self,
        *,
        round_s: float = DEFAULT_ROUND_S,
        energy_weight: float = DEFAULT_ENERGY_WEIGHT,
        episode_rounds: int = DEFAULT_EPISODE_ROUNDS,
        run_id: str | None = None,
    ) -> None:
        if episode_rounds < 1:
            raise ValueError(f"episode_rounds={episode_rounds!r}: must be >= 1")
        self.round_s = round_s
        self.energy_weight = energy_weight
        self.episode_rounds = episode_rounds
        self.run_id = run_id or f"{utc_now():%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
        self._episode = 0
        self._step = 0
        self._open: _Open | None = None
        self.rows = 0
        """Rounds logged since start."""

    @property
    def episode(self) -> str:
        return f"{self.run_id}-{self._episode:04d}"

    def record(
        self,
        session: Session,
        *,
        acted: ActedStep | None,
        outcome: RoundOutcome | None,
        snapshot: ClusterSnapshot,
        round_: DecisionRound,
        overrides: Mapping[str, object],
        stored: list[Decision],
    ) -> None:
        """Measure the previous round with ``outcome`` (what the backend reported of the
        round it ran before ``snapshot``), then log this one if the acting policy decided
        it (``acted``: what it saw and did).

        A round the policy does not log (the fallback decided it, the module failed,
        nothing was in its slots) ends the chain: the round before it is truncated, so no
        transition links across a round someone else decided. A job whose new
        configuration the Planner declined (no room) counts as the policy's: the
        environment declines it the same way, and the outcome is the action's."""
        step = acted
        logs = step is not None and bool(step.job_ids)
        self._close(session, outcome, snapshot, continues=logs)
        if not logs:
            return
        assert step is not None
        decided = {d.job_id: d for d in stored}
        applied = [
            job_id not in overrides
            and (job_id not in decided or decided[job_id].source == "policy")
            and job_id not in round_.skipped_overrides
            for job_id in step.job_ids
        ]
        used = HEADER + len(SLOT) * len(step.job_ids)
        transition_id = repo.create_transition(
            session=session,
            episode=self.episode,
            step=self._step,
            policy_version=step.policy_version,
            epsilon=step.epsilon,
            sim_time_s=snapshot.time_s,
            observation=repo.pack_observation(step.observation, used),
            slots={
                "jobs": list(step.job_ids),
                "running": [bool(r) for r in step.running],
                "entries": step.entries.tolist(),
                "mask": step.mask.astype(int).tolist(),
                "logp": step.logp.tolist(),
                "applied": applied,
            },
        )
        self.rows += 1
        self._step += 1
        last = self._step >= self.episode_rounds
        self._open = _Open(transition_id, step.job_ids, last, snapshot.time_s)
        if last:
            self._episode += 1
            self._step = 0

    def _close(
        self,
        session: Session,
        outcome: RoundOutcome | None,
        snapshot: ClusterSnapshot,
        *,
        continues: bool,
    ) -> None:
        """Fill in the open row's reward from the round the backend just ran;
        ``continues``: this tick logs a round that follows it."""
        open_, self._open = self._open, None
        if open_ is None:
            return
        # Ticks failed in between: the backend's last round is not the one decided then.
        stale = snapshot.time_s - open_.time_s > 1.5 * self.round_s
        if outcome is None or stale:
            repo.set_transition_reward(
                session=session,
                transition_id=open_.transition_id,
                reward=None,
                parts=None,
                truncated=True,
            )
            return
        weights = {"round_s": self.round_s, "energy_weight": self.energy_weight}
        terms = RewardWeights(energy_weight=self.energy_weight)
        total, parts = reward(outcome, round_s=self.round_s, weights=terms)
        mine = job_rewards(outcome, round_s=self.round_s, weights=terms)
        states = {j.spec.job_id: j.state for j in snapshot.jobs}
        try:
            speeds = _speeds(snapshot, set(open_.job_ids))
        except Exception as exc:  # a calibration figure is not worth a failed tick
            event("transitions.speeds_failed", level=30, error=f"{type(exc).__name__}: {exc}")
            speeds = {}
        jobs: dict[str, dict[str, Any]] = {}
        for job_id in open_.job_ids:
            value, job_parts = mine.get(job_id, (0.0, dict.fromkeys(parts, 0.0)))
            jobs[job_id] = {
                "reward": _round(value),
                **{name: _round(v) for name, v in job_parts.items()},
                "ended": states.get(job_id) not in ACTIVE_STATES,
            }
            if job_id in speeds:
                jobs[job_id]["speed"] = speeds[job_id]
        repo.set_transition_reward(
            session=session,
            transition_id=open_.transition_id,
            reward=total,
            parts={
                "cluster": {name: _round(v) for name, v in parts.items()},
                "jobs": jobs,
                "weights": weights,
            },
            truncated=open_.last_of_episode or not continues,
        )

    def close(self, session: Session) -> None:
        """The daemon stops: the round still waiting for its measurement ends its
        episode."""
        if self._open is not None:
            repo.set_transition_reward(
                session=session,
                transition_id=self._open.transition_id,
                reward=None,
                parts=None,
                truncated=True,
            )
            self._open = None


def _round(value: float) -> float:
    """Seven significant digits: what a reward part means, in a third of the bytes."""
    return float(f"{value:.7g}")


def _speeds(snapshot: ClusterSnapshot, job_ids: set[str]) -> dict[str, list[float]]:
    """``[measured, model]`` goodput of each running job among ``job_ids`` over the round
    the backend just ran: what it measured (samples/s times statistical efficiency, as the
    daemon's ``job_goodput``) and what the performance model predicts for the same
    configuration and placement without stragglers (an application's calibrated
    coefficients where its model is one). Replay calibrates each job by their ratio."""
    nodes = {n.node_id: n for n in snapshot.nodes}
    out: dict[str, list[float]] = {}
    for job in snapshot.by_state("running"):
        spec = job.spec
        if (
            spec.job_id not in job_ids
            or spec.model is None
            or job.config is None
            or job.placement is None
            or job.samples_per_s <= 0
            or any(slot.node_id not in nodes for slot in job.placement.ranks)
        ):
            continue
        batch = job.config.batch(spec)
        shape = shape_of(job.placement, nodes)
        coeffs = catalog_coefficients(spec.model, shape.gpu_model)
        profile = job.profile
        assert profile is not None
        predicted = estimate(
            profile,
            job.config,
            shape,
            batch,
            coeffs=coeffs,
            straggler_cv=median_cv(),
        ).goodput
        if predicted > 0:
            measured = job.samples_per_s * statistical_efficiency(profile, job.config, batch)
            out[spec.job_id] = [_round(measured), _round(predicted)]
    return out
