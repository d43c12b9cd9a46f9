"""How a learned policy acts, as the transition log records it: epsilon-greedy over the
module's most likely value of each action entry, so the log-probability of every logged
action is known and never 0 or 1 (the importance weights of off-policy estimates stay
bounded), and which entries of a slot's action mattered.

Part of the reinforcement-learning contract (``autotune.rl``): the daemon's learned
policy acts this way and returns an ``ActedStep`` with its choices
(``autotune.interfaces.PolicyRound``), the transition log stores it, replay's off-policy
estimates read it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autotune.rl.action import ACTION_DIMS

__all__ = ["ActedStep", "action_mask", "entry_probabilities", "logged_logp", "split_logits"]


def entry_probabilities(logits: np.ndarray, epsilon: float | np.ndarray) -> list[np.ndarray]:
    """The acting distribution of each action entry: epsilon-greedy over the module's
    most likely value, ``(1 - eps) * [v == argmax] + eps / n``.

    ``logits``: ``(N, sum(ACTION_DIMS))``, one slot per row; ``epsilon``: a float or one
    per row. Returns one ``(N, n_d)`` array per entry, each row summing to 1. Every value
    keeps probability at least ``eps / n``, so the importance weights of off-policy
    estimates stay bounded."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[1] != sum(ACTION_DIMS):
        raise ValueError(f"logits of shape {logits.shape}: expected (N, {sum(ACTION_DIMS)})")
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (logits.shape[0],))
    if np.any((eps < 0) | (eps > 1)):
        raise ValueError("epsilon must be in [0, 1]")
    out: list[np.ndarray] = []
    start = 0
    for n in ACTION_DIMS:
        part = logits[:, start : start + n]
        start += n
        probs = np.repeat((eps / n)[:, None], n, axis=1)
        probs[np.arange(len(part)), part.argmax(1)] += 1.0 - eps
        out.append(probs)
    return out


def action_mask(entries: np.ndarray, running: np.ndarray) -> np.ndarray:
    """Which entries of each slot's action mattered: a running job that keeps its
    configuration (``change`` 0) used only ``change``; one that changes, every entry; a
    waiting job (always configured) every entry but ``change``. ``entries``: ``(N, 7)``;
    ``running``: ``(N,)`` bools. Returns ``(N, 7)`` bools."""
    entries = np.asarray(entries)
    running = np.asarray(running, dtype=bool)
    mask = np.ones(entries.shape, dtype=bool)
    keep = running & (entries[:, 0] == 0)
    mask[keep, 1:] = False
    mask[~running, 0] = False
    return mask


def logged_logp(
    probabilities: list[np.ndarray], entries: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Log-probability of the taken ``entries`` ``(N, 7)`` under ``probabilities``
    (``entry_probabilities``): per entry ``(N, 7)`` (0 where ``mask`` is off) and joint
    ``(N,)`` over the entries that mattered."""
    entries = np.asarray(entries, dtype=np.int64)
    rows = np.arange(entries.shape[0])
    per = np.stack([np.log(p[rows, entries[:, d]]) for d, p in enumerate(probabilities)], axis=1)
    per = np.where(mask, per, 0.0)
    return per, per.sum(1)


@dataclass(frozen=True, slots=True)
class ActedStep:
    """What a ``LearnedPolicy`` saw and did in one round, for the transition log:
    the encoded observation, the job in each acted slot, the entries taken, which
    mattered, and their log-probabilities under the acting (epsilon-greedy) policy."""

    observation: np.ndarray
    job_ids: tuple[str, ...]
    """The job in slot k (slots beyond these were empty)."""
    running: np.ndarray
    entries: np.ndarray
    """``(len(job_ids), 7)``"""
    mask: np.ndarray
    logp: np.ndarray
    """Per entry ``(len(job_ids), 7)``, 0 where masked out."""
    epsilon: float
    policy_version: str


def split_logits(logits: np.ndarray) -> list[np.ndarray]:
    """``(N, sum(ACTION_DIMS))`` -> one ``(N, n_d)`` block per action entry."""
    bounds = np.cumsum(ACTION_DIMS)[:-1]
    return list(np.split(logits, bounds, axis=1))
