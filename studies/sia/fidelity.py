"""The Sia-compatible world against Sia's own simulator: a workload played under a policy
both can run, job by job (``bench/sia_compat.py`` runs it).

``play`` runs a Sia workload's jobs in ``sia_env`` under a policy (by default the shared
baseline, ``SiaFifoPolicy``) and reports every job's completion time and where it
first ran; ``compare`` sets those beside what Sia's simulator reported for the same
jobs (``bench/sia_fifo_anchor.py``'s JSON).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.simulator import SimulatedCluster
from autotune.interfaces import ClusterSnapshot, Policy
from autotune.policies.evaluate import run_episode
from autotune.studies.sia.fifo import SiaFifoPolicy
from autotune.studies.sia.goodput import SiaGoodputPolicy
from autotune.studies.sia.trace import SIA_TYPE_OF, load_sia_apps
from autotune.studies.sia.world import ROUND_S, sia_arrivals, sia_env

__all__ = ["PHILLY", "POLICIES", "SATURN", "compare", "play", "sia_jcts"]


POLICIES: Final = ("fifo", "goodput")
SATURN: Final = tuple(f"saturn/workload-{n}.csv" for n in range(1, 11))
"""Sia's ten Helios ("saturn") workloads, as named under its ``workloads`` folder ..."""
PHILLY: Final = tuple(f"philly/workload-{n}.csv" for n in range(1, 9))
"""... and its eight Philly ones."""


def play(
    workload: str | Path,
    sia: str | Path,
    *,
    round_s: float = ROUND_S,
    policy: str | Callable[[ClusterEnv], Policy] = "fifo",
    mix: bool = False,
) -> dict[str, Any]:
    """``workload`` (a Sia workload CSV) in the Sia-compatible world (``sia``: the
    artifact's ``sia-simulator`` folder) under ``policy``: ``fifo`` (``SiaFifoPolicy``,
    rigid jobs), ``goodput`` (``SiaGoodputPolicy``, elastic jobs) or a function of the
    environment giving the policy (elastic jobs: a learned one, another exponent). The
    average JCT in hours, each job's JCT in seconds and its first placement as Sia
    names it ([type, ranks per node]), the restarts, preemptions and the wall time.
    ``mix``: jobs may run across GPU types (``sia_env``'s), and ``mixed_gpu_rounds`` the
    share of busy GPU-rounds held by jobs across types."""
    if isinstance(policy, str) and policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: one of {', '.join(POLICIES)}")
    began = time.perf_counter()
    env = sia_env(sia_arrivals(workload, sia, elastic=policy != "fifo"), round_s=round_s, mix=mix)
    chosen: Policy
    if policy == "fifo":
        chosen = SiaFifoPolicy(load_sia_apps(sia))
    elif policy == "goodput":
        chosen = SiaGoodputPolicy(env)
    else:
        assert callable(policy)
        chosen = policy(env)
    first: dict[str, list[Any]] = {}
    started: dict[str, float] = {}
    model_of = {node.node_id: node.gpu_model for node in env.nodes}

    gpu_rounds = [0, 0]  # busy, across types

    def seen(decided_on: ClusterSnapshot, sim: SimulatedCluster) -> None:
        for job in sim.jobs.values():
            status = job.status
            if status.state == "running" and status.placement:
                ranks = status.placement.ranks
                gpu_rounds[0] += len(ranks)
                if len(status.placement.ranks_by_model(model_of)) > 1:
                    gpu_rounds[1] += len(ranks)
            if status.state == "running" and status.placement and job.job_id not in first:
                nodes = Counter(slot.node_id for slot in status.placement.ranks)
                model = model_of[status.placement.ranks[0].node_id]
                first[job.job_id] = [SIA_TYPE_OF.get(model, model), sorted(nodes.values())[::-1]]
                started[job.job_id] = decided_on.time_s

    result = run_episode(chosen, env, seed=0, on_round=seen)
    sim = env.sim
    assert sim is not None
    jcts = {
        job.job_id: (job.status.finished_s or math.nan) - job.status.spec.submitted_at
        for job in sim.jobs.values()
    }
    return {
        "avg_jct_h": result["avg_jct_s"] / 3600,
        "finished": len(sim.finished_jobs()),
        "jobs": len(jcts),
        "restarts": sum(job.restarts for job in sim.jobs.values()),
        "preemptions": sum(job.preemptions for job in sim.jobs.values()),
        "jcts_s": jcts,
        "placements": first,
        "started_s": started,
        "mixed_gpu_rounds": gpu_rounds[1] / gpu_rounds[0] if gpu_rounds[0] else 0.0,
        "wall_s": round(time.perf_counter() - began, 2),
    }


def compare(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """``play``'s result beside Sia's for the same workload (``jcts_s`` per job, and
    ``placements`` where both have them): the averages, their relative difference, and
    how many jobs finished within a second of Sia's time and started on the same type
    and ranks per node."""
    mine, sias = ours["jcts_s"], theirs["jcts_s"]
    if set(mine) != set(sias):
        missing = sorted(set(mine) ^ set(sias))[:5]
        raise ValueError(f"the two runs differ in their jobs (e.g. {missing})")
    ours_h = sum(mine.values()) / len(mine) / 3600
    sia_h = sum(sias.values()) / len(sias) / 3600
    placed = theirs.get("placements", {})
    same_place = sum(
        1
        for job, where in ours["placements"].items()
        if job in placed and [placed[job][0], sorted(placed[job][1])[::-1]] == where
    )
    diffs = {job: mine[job] - sias[job] for job in mine}
    worst = max(diffs, key=lambda job: abs(diffs[job]))
    return {
        "ours_avg_jct_h": round(ours_h, 4),
        "sia_avg_jct_h": round(sia_h, 4),
        "relative_difference": round(ours_h / sia_h - 1, 5),
        "jobs": len(mine),
        "jobs_within_1s": sum(1 for d in diffs.values() if abs(d) <= 1.0),
        "same_first_placement": same_place,
        "largest_job_difference_s": {worst: diffs[worst]},
    }


def sia_jcts(log: Path) -> dict[str, float]:
    """Every finished job's JCT (s) in a Sia ``--output`` log (its last record)."""
    last = ""
    with log.open() as f:
        for line in f:
            if line.strip():
                last = line
    if not last:
        raise ValueError(f"{log}: empty")
    record = json.loads(last)
    return {
        job["name"]: float(job["completion_time"]) - float(job["submission_time"])
        for job in record["submitted_jobs"]
        if job.get("completion_time") is not None
    }
