"""The Gymnasium spaces of the environment, built from the reinforcement-learning
contract (``autotune.rl``): the observation ``Box`` from ``autotune.rl.observation``'s
feature bounds, the ``MultiDiscrete`` action from ``autotune.rl.action``'s fields.

**Action in the Pollux-compatible mode** (``knobs="pollux"``): one number per slot,
log2 of the job's weight in the goodput allocation (``POLLUX_WEIGHT_RANGE``;
``pollux_action_space``, ``decode_weights``), which turns weights into each job's GPU
count and batch size (``autotune.policies.goodput``).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from gymnasium import spaces

from autotune.interfaces import ClusterSnapshot
from autotune.rl.action import ACTION_DIMS, InvalidActionError
from autotune.rl.observation import observation_bounds, slot_jobs

__all__ = [
    "POLLUX_WEIGHT_RANGE",
    "action_space",
    "decode_weights",
    "encode_weights",
    "observation_space",
    "pollux_action_space",
]

POLLUX_WEIGHT_RANGE: Final = (-6.0, 6.0)
"""Bounds of the Pollux-compatible mode's action entry: log2 of a job's weight in the
goodput allocation (a weight of 1/64 to 64; beyond is clipped)."""


def observation_space(slots: int) -> spaces.Box:
    low, high = observation_bounds(slots)
    return spaces.Box(low, high, dtype=np.float32)


def action_space(slots: int) -> spaces.MultiDiscrete:
    return spaces.MultiDiscrete(np.array(ACTION_DIMS * slots, dtype=np.int64))


# -- the Pollux-compatible mode's action ---------------------------------------------


def pollux_action_space(slots: int) -> spaces.Box:
    """One entry per slot: log2 of the job's weight in the goodput allocation."""
    low, high = POLLUX_WEIGHT_RANGE
    return spaces.Box(low, high, (slots,), dtype=np.float32)


def decode_weights(action: np.ndarray, snapshot: ClusterSnapshot, slots: int) -> dict[str, float]:
    """The slot jobs' weights an action of ``pollux_action_space`` means (entries beyond
    ``POLLUX_WEIGHT_RANGE`` clipped, as for any bounded continuous action). Raises
    ``InvalidActionError`` for a wrong length or a value that is not a number; jobs
    beyond the slots keep weight 1."""
    flat = np.asarray(action, dtype=np.float64).reshape(-1)
    if flat.shape != (slots,):
        raise InvalidActionError(f"action has {flat.size} entries; expected {slots}")
    if not np.isfinite(flat).all():
        raise InvalidActionError("action has an entry that is not a finite number")
    low, high = POLLUX_WEIGHT_RANGE
    return {
        job.spec.job_id: float(2.0 ** np.clip(flat[slot], low, high))
        for slot, job in enumerate(slot_jobs(snapshot, slots))
    }


def encode_weights(weights: dict[str, float], snapshot: ClusterSnapshot, slots: int) -> np.ndarray:
    """The action that decodes to (about) ``weights`` (a slot whose job has none: 1)."""
    low, high = POLLUX_WEIGHT_RANGE
    out = np.zeros(slots, dtype=np.float32)
    for slot, job in enumerate(slot_jobs(snapshot, slots)):
        weight = weights.get(job.spec.job_id, 1.0)
        out[slot] = float(np.clip(math.log2(weight), low, high))
    return out
