"""The Gymnasium spaces of the environment, built from the reinforcement-learning
contract (``autotune.rl``): the observation ``Box`` from ``autotune.rl.observation``'s
feature bounds, the ``MultiDiscrete`` action from ``autotune.rl.action``'s fields.

A study's world with an action of its own builds its space beside it
(``autotune.studies.pollux.env.weight_space``).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import observation_bounds

__all__ = ["action_space", "observation_space"]


def observation_space(slots: int) -> spaces.Box:
    low, high = observation_bounds(slots)
    return spaces.Box(low, high, dtype=np.float32)


def action_space(slots: int) -> spaces.MultiDiscrete:
    return spaces.MultiDiscrete(np.array(ACTION_DIMS * slots, dtype=np.int64))
