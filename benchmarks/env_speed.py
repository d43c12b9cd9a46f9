"""Environment steps per second on one core, random actions (`python bench/env_speed.py`).

Prints one JSON object: steps/s for each registered environment over ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym

import autotune.envs  # noqa: F401 - registers the environments


def measure(env_id: str, seconds: float, seed: int) -> float:
    env = gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ids = ["autotune/ClusterSmall-v0", "autotune/Cluster-v0"]
    print(json.dumps({i: round(measure(i, args.seconds, args.seed)) for i in ids}))


if __name__ == "__main__":
    main()
