"""Latency of the learned policy per decision round, on one CPU core.

Two measurements, each over ``--rounds`` rounds after a warm-up:

- ``env``: a full ``ClusterEnv`` round at 32 job slots as ``autotune eval`` runs it: the
  LSTM forecast from the rounds so far, then ``forward_inference`` and the per-entry
  argmax (``PPOSimPolicy.act``); ``forward_only`` the last two alone; the environment's
  own step is not timed;
- ``daemon``: ``LearnedPolicy.decide`` on a daemon snapshot with 32 active jobs: the
  observation built from the snapshot, the forecast, the forward pass and the
  JobConfigs of the pending jobs.

    python bench/serving.py [--checkpoint DIR] [--rounds 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch

from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.sim_backend import SimulatedCluster, SimulatedClusterConfig
from autotune.policies.serving import LearnedPolicy, PPOSimPolicy


def _stats(samples: list[float]) -> dict[str, float]:
    ms = np.asarray(samples) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "rounds": len(samples),
    }


def bench_env(checkpoint: str | None, rounds: int, slots: int) -> dict[str, float]:
    policy = PPOSimPolicy(checkpoint, slots=slots)
    env = ClusterEnv(slots=slots, n_jobs=400, mean_interarrival_s=60.0, max_steps=10**6)
    obs, _ = env.reset(seed=0)
    times: list[float] = []
    forward: list[float] = []
    busy_slots: list[int] = []
    for i in range(rounds + 50):
        start = time.perf_counter()
        action = policy.act(env, obs)
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        policy.server.act(obs)
        forward_s = time.perf_counter() - start
        if i >= 50:
            times.append(elapsed)
            forward.append(forward_s)
            assert env.sim is not None
            busy_slots.append(min(slots, len(env.sim.active)))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset(seed=i)
    return {
        **_stats(times),
        "forward_only": _stats(forward),
        "mean_occupied_slots": float(np.mean(busy_slots)),
    }


def bench_daemon(checkpoint: str | None, rounds: int, slots: int) -> dict[str, float]:
    policy = LearnedPolicy(checkpoint, slots=slots)
    if policy.server is None:
        raise SystemExit(f"the checkpoint does not load: {policy.fallback_reason}")
    backend = SimulatedCluster(SimulatedClusterConfig(seed=0, initial_jobs=slots))
    snapshot = backend.observe()
    assert len(snapshot.by_state("pending", "running")) >= slots
    times: list[float] = []
    for i in range(rounds + 50):
        start = time.perf_counter()
        policy.decide(snapshot)
        if i >= 50:
            times.append(time.perf_counter() - start)
    return _stats(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the shipped policy")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        "(pinned to 1), torch threads 1",
        "slots": args.slots,
        "env": bench_env(args.checkpoint, args.rounds, args.slots),
        "daemon": bench_daemon(args.checkpoint, args.rounds, args.slots),
    }
    if args.json:
        print(json.dumps(report))
        return
    for name in ("env", "daemon"):
        row = report[name]
        print(
            f"{name:7s} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  "
            f"max {row['max_ms']:.3f} ms over {row['rounds']} rounds"
        )


if __name__ == "__main__":
    main()
