"""Latency of the learned policy per decision round, on one CPU core.

Two measurements, each over ``--rounds`` rounds after ``--warmup`` rounds:

- ``env``: ``ClusterEnv`` rounds at ``--slots`` job slots as ``autotune eval`` runs the
  ``ppo`` row: ``LearnedPolicy.decide(env.snapshot)`` (``policy``: the observation
  encoded from the snapshot, the LSTM forecast from the rounds so far, the forward pass
  and per-entry argmax, the slots decoded into choices), ``forward_only`` the forward
  pass and argmax alone (``PolicyServer.act``), ``env_step`` the environment's own round
  (``env.step_choices``: the daemon's decision step with the Planner, then the simulated
  cluster's round) and ``round`` the two together;
- ``daemon``: ``LearnedPolicy.decide`` on a snapshot of the daemon's simulated cluster
  (``SimulatedCluster``, ``--backend sim``) with at least ``--slots`` active jobs
  (``policy``), and, when the checkpoint does not load, the rules fallback the daemon
  then decides with (``fallback_rules``).

The checkpoint must fit the current observation and action spaces
(``autotune.envs.spaces``). When it does not load, the daemon would decide with the rules
fallback; the report says so (``checkpoint.fallback_reason``) and times an UNTRAINED
stand-in instead (a ``SlotPolicyModule`` with random weights, same network and spaces):
its latency is the trained policy's, its decisions mean nothing.

    python bench/serving.py [--checkpoint DIR] [--rounds 2000] [--warmup 50] [--slots 32]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.serving import IncompatiblePolicyError, LearnedPolicy, PolicyServer


def _stats(samples: list[float]) -> dict[str, float]:
    ms = np.asarray(samples) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "rounds": len(samples),
    }


def untrained_module(path: Path, slots: int, hidden: int = 64) -> Path:
    """An untrained ``SlotPolicyModule`` for the current spaces, saved under ``path``."""
    from autotune.envs.spaces import action_space, observation_space
    from autotune.policies.ppo import SlotPolicyModule

    module = SlotPolicyModule(
        observation_space=observation_space(slots),
        action_space=action_space(slots),
        model_config={"hidden": hidden},
    )
    module.save_to_path(path)
    return path


def load_server(
    checkpoint: str | None, slots: int, scratch: Path
) -> tuple[PolicyServer, dict[str, Any]]:
    """The checkpoint's server, or an untrained stand-in when it does not load."""
    try:
        server = PolicyServer(checkpoint, slots=slots)
        return server, {"path": str(server.path), "loaded": True, "module": "checkpoint"}
    except IncompatiblePolicyError as exc:
        reason = str(exc)
    stand_in = untrained_module(scratch / "untrained", slots)
    return PolicyServer(stand_in, slots=slots), {
        "path": checkpoint or "shipped policy",
        "loaded": False,
        "fallback_reason": reason,
        "module": "UNTRAINED stand-in (SlotPolicyModule, random weights): latency only",
    }


def bench_env(server: PolicyServer, rounds: int, warmup: int, slots: int) -> dict[str, Any]:
    env = ClusterEnv(slots=slots, n_jobs=400, mean_interarrival_s=60.0, max_steps=10**6)
    obs, _ = env.reset(seed=0)
    policy = LearnedPolicy(slots=slots, round_s=env.round_s, server=server)
    decide: list[float] = []
    forward: list[float] = []
    step: list[float] = []
    occupied: list[int] = []
    for i in range(rounds + warmup):
        assert env.snapshot is not None
        assert env.sim is not None
        start = time.perf_counter()
        choices = policy.decide(env.snapshot).choices
        decided = time.perf_counter()
        server.act(obs)
        forwarded = time.perf_counter()
        active = len(env.sim.active_jobs())
        obs, _, terminated, truncated, _ = env.step_choices(choices)
        stepped = time.perf_counter()
        if i >= warmup:
            decide.append(decided - start)
            forward.append(forwarded - decided)
            step.append(stepped - forwarded)
            occupied.append(min(slots, active))
        if terminated or truncated:
            obs, _ = env.reset(seed=i)
            policy = LearnedPolicy(slots=slots, round_s=env.round_s, server=server)
    return {
        "policy": _stats(decide),
        "forward_only": _stats(forward),
        "env_step": _stats(step),
        "round": _stats([a + b for a, b in zip(decide, step, strict=True)]),
        "mean_occupied_slots": float(np.mean(occupied)),
    }


def _time_decide(policy: LearnedPolicy, snapshot: Any, rounds: int, warmup: int) -> list[float]:
    times: list[float] = []
    for i in range(rounds + warmup):
        start = time.perf_counter()
        policy.decide(snapshot)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def bench_daemon(
    server: PolicyServer, rounds: int, warmup: int, slots: int, fallback: str | None
) -> dict[str, Any]:
    """``fallback``: the checkpoint that did not load (``""``: the shipped one), whose
    rules fallback is timed as well; ``None``: it loaded."""
    backend = SimulatedCluster(SimConfig(seed=0, initial_jobs=slots))
    snapshot = backend.observe()
    active = len(snapshot.by_state("pending", "running"))
    assert active >= slots, f"{active} active jobs, fewer than {slots} slots"
    policy = LearnedPolicy(slots=slots, server=server)
    report: dict[str, Any] = {
        "policy": _stats(_time_decide(policy, snapshot, rounds, warmup)),
        "active_jobs": active,
    }
    if fallback is not None:  # what the daemon would run: the rules fallback
        rules = LearnedPolicy(fallback or None, slots=slots)
        assert rules.server is None
        report["fallback_rules"] = _stats(_time_decide(rules, snapshot, rounds, warmup))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the shipped policy")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50, help="untimed rounds first")
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        server, checkpoint = load_server(args.checkpoint, args.slots, Path(scratch))
        report = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
            "(pinned to 1), torch threads 1",
            "slots": args.slots,
            "checkpoint": checkpoint,
            "env": bench_env(server, args.rounds, args.warmup, args.slots),
            "daemon": bench_daemon(
                server,
                args.rounds,
                args.warmup,
                args.slots,
                None if checkpoint["loaded"] else (args.checkpoint or ""),
            ),
        }
    if args.json:
        print(json.dumps(report))
        return
    if not checkpoint["loaded"]:
        print(f"checkpoint did not load ({checkpoint['fallback_reason']})")
        print(f"timing an {checkpoint['module']}")
    rows = [
        ("env decide", report["env"]["policy"]),
        ("env forward", report["env"]["forward_only"]),
        ("env step", report["env"]["env_step"]),
        ("env round", report["env"]["round"]),
        ("daemon decide", report["daemon"]["policy"]),
    ]
    if "fallback_rules" in report["daemon"]:
        rows.append(("daemon rules", report["daemon"]["fallback_rules"]))
    for name, row in rows:
        print(
            f"{name:14s} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  "
            f"max {row['max_ms']:.3f} ms over {row['rounds']} rounds"
        )
    print(
        f"env: {report['env']['mean_occupied_slots']:.1f} of {args.slots} slots occupied on "
        f"average; daemon: {report['daemon']['active_jobs']} active jobs"
    )


if __name__ == "__main__":
    main()
