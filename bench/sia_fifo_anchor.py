"""FIFO on the fastest free GPU type, run inside Sia's own simulator (SOSP'23 artifact).

What it is
----------
An anchor point for comparing our simulator with Sia's: a deliberately simple,
deterministic scheduling policy ("fifo-fastest-type") is run inside Sia's
simulator, and the per-job completion times (JCTs) are written as JSON.

The policy is written here; Sia's ``Cluster``, ``Job`` and ``applications``
(throughput traces, restart costs, epoch/progress model) are imported and used
unchanged. No Sia code is copied: the simulator's folder is given on the command
line, put first on ``sys.path`` and made the working directory.

The loop mimics ``multi_simulator.py --policy=gavel``: Sia's default cluster
(``simulator_config.cluster_nnodes``, i.e. 6 "aws" 4-GPU nodes, 2 "dgx-ext" and
3 "rtx" 8-GPU nodes), ``Cluster(workload_df, policy, ...)``,
``cluster.disable_bsz_tuning()``, then ``cluster.step(interval)`` until every job
is complete. ``Cluster`` only accepts Gavel/Sia policy objects and treats a
``GavelPolicy`` as rigid (fixed number of replicas and batch size), so the policy
is a subclass of ``gavel.GavelPolicy`` that overrides ``optimize``.

Policy, each round:

1. A job that already holds GPUs keeps exactly the same allocation (no
   preemption, no migration).
2. The other jobs, in order of (submission time, workload order), try each GPU
   type from the fastest to the slowest for that job (throughput =
   ``Application.get_throughput_with_accum`` with the replicas packed onto full
   nodes, ties by type name). The first type with enough free GPUs takes the
   job, filling its nodes with the most free GPUs first (ties: lower node
   index), unless that would span more than ``cluster_max_physical_nnodes``
   nodes. A job no type takes waits; later jobs may still start (backfill).
3. A type with no usable throughput measurement for a job (non-positive or NaN)
   is skipped for that job, with a warning on stderr.

How to run
----------
Needs a Python environment that can import Sia's ``cluster.py`` (Sia's
requirements.txt plus what its modules import): numpy 1.23.5, pandas<2,
scipy, cvxpy, ecos, rich, psutil, autograd, pymoo 0.4.2.2. It does not import
``autotune``. Example::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /tmp/sia-venv/bin/python \\
        bench/sia_fifo_anchor.py --sia /tmp/sia-run/sia-simulator --interval 60 \\
        --out bench/out/sia_fifo_anchor.json \\
        /tmp/sia-run/sia-simulator/workloads/saturn/workload-1.csv

The simulator's (very verbose) stdout goes to ``--log`` (default /dev/null);
a short progress line per workload goes to stderr. The JSON file is rewritten
after each workload, so a crash loses only the workload in progress.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

POLICY_NAME = "fifo-fastest-type"


def packed_placement(num_replicas: int, ngpus_per_node: int) -> list[int]:
    """Replicas on full nodes first, then the rest: 6 on 4-GPU nodes -> [4, 2]."""
    full, rest = divmod(num_replicas, ngpus_per_node)
    return [ngpus_per_node] * full + ([rest] if rest else [])


def placement_of(node_ids: list[int] | tuple[int, ...]) -> list[int]:
    """Replicas per node, grouping consecutive equal node ids (as Sia's Cluster does)."""
    counts: list[int] = []
    for i, node in enumerate(node_ids):
        if i == 0 or node != node_ids[i - 1]:
            counts.append(1)
        else:
            counts[-1] += 1
    return counts


def make_policy_class(gavel_policy_base: type) -> type:
    """Build the policy as a subclass of Sia's ``gavel.GavelPolicy`` (imported at runtime)."""

    class FifoFastestTypePolicy(gavel_policy_base):  # type: ignore[misc, valid-type]
        def __init__(
            self,
            interval: int,
            max_physical_nodes: dict[str, int],
            warn: Any = None,
        ) -> None:
            super().__init__(interval)
            self.max_physical_nodes = dict(max_physical_nodes)
            self.warn = warn if warn is not None else (lambda msg: None)
            self.first_placements: dict[str, list[Any]] = {}
            self._xput_cache: dict[tuple[str, str], float | None] = {}
            self._warned: set[tuple[str, str]] = set()
            self._checked: set[str] = set()
            self.rounds = 0

        def populate_valid_configs(self, *args: Any, **kwargs: Any) -> None:
            """Not needed: the cluster shape comes from ``nodes`` in ``optimize``."""

        def throughput(self, name: str, job: Any, gpu_type: str, ngpus: int) -> float | None:
            """Samples/s of ``job`` packed on ``gpu_type``; None where Sia has no measurement."""
            key = (name, gpu_type)
            if key not in self._xput_cache:
                packed = packed_placement(job.scale_factor, ngpus)
                try:
                    xput = float(
                        job.applications[gpu_type].get_throughput_with_accum(
                            packed, job.target_batch_size
                        )
                    )
                except (AssertionError, ValueError, KeyError, ZeroDivisionError) as exc:
                    xput = float("nan")
                    reason = f"{type(exc).__name__}: {exc}"
                else:
                    reason = f"throughput {xput}"
                if not (xput > 0):  # catches NaN as well
                    if key not in self._warned:
                        self._warned.add(key)
                        self.warn(
                            f"warning: no throughput for job {name} on {gpu_type} "
                            f"{packed} (bsz {job.target_batch_size}): {reason}; type skipped"
                        )
                    self._xput_cache[key] = None
                else:
                    self._xput_cache[key] = xput
            return self._xput_cache[key]

        def optimize(
            self, jobs: dict[str, Any], nodes: dict[str, dict[int, Any]], prev_allocations: dict
        ) -> dict[str, tuple[str, list[int]]]:
            self.rounds += 1
            types = sorted(nodes)
            ngpus = {
                t: {i: int(info.resources["nvidia.com/gpu"]) for i, info in nodes[t].items()}
                for t in types
            }
            free = {t: dict(ngpus[t]) for t in types}
            # a job that no type could ever take would make the simulation loop endless
            self.check_feasible({n: j for n, j in jobs.items() if n not in self._checked}, nodes)
            self._checked.update(jobs)
            allocations: dict[str, Any] = {}

            # 1. running jobs keep exactly what they hold (same object: no restart)
            for name, alloc in prev_allocations.items():
                if name not in jobs:
                    continue
                gpu_type, node_ids = alloc
                for node in node_ids:
                    free[gpu_type][node] -= 1
                    if free[gpu_type][node] < 0:
                        raise RuntimeError(f"node {gpu_type}/{node} over-allocated")
                allocations[name] = alloc

            # 2. the waiting jobs in FIFO order, each on the fastest type that takes it
            order = sorted(
                (job.submission_time, pos, name)
                for pos, (name, job) in enumerate(jobs.items())
                if name not in allocations
            )
            for _, _, name in order:
                job = jobs[name]
                need = int(job.scale_factor)
                ranked = []
                for t in types:
                    per_node = max(ngpus[t].values())
                    xput = self.throughput(name, job, t, per_node)
                    if xput is not None:
                        ranked.append((-xput, t))
                ranked.sort()
                for _, t in ranked:
                    if need > sum(ngpus[t].values()) or need > sum(free[t].values()):
                        continue
                    node_ids: list[int] = []
                    used_nodes = 0
                    for node in sorted(free[t], key=lambda i, t=t: (-free[t][i], i)):
                        if len(node_ids) == need:
                            break
                        take = min(free[t][node], need - len(node_ids))
                        if take <= 0:
                            break
                        node_ids.extend([node] * take)
                        used_nodes += 1
                    if used_nodes > self.max_physical_nodes.get(t, math.inf):
                        continue
                    for node in node_ids:
                        free[t][node] -= 1
                    allocations[name] = (t, node_ids)
                    if name not in self.first_placements:
                        self.first_placements[name] = [t, placement_of(node_ids)]
                    break
            return allocations

        def check_feasible(self, jobs: dict[str, Any], nodes: dict[str, dict[int, Any]]) -> None:
            """Raise if some job could not start even on an empty cluster (the loop would hang)."""
            for name, job in jobs.items():
                ok = False
                for t in sorted(nodes):
                    per_node = [int(i.resources["nvidia.com/gpu"]) for i in nodes[t].values()]
                    need = int(job.scale_factor)
                    span = len(packed_placement(need, max(per_node)))
                    if (
                        need <= sum(per_node)
                        and span <= self.max_physical_nodes.get(t, math.inf)
                        and self.throughput(name, job, t, max(per_node)) is not None
                    ):
                        ok = True
                        break
                if not ok:
                    raise RuntimeError(f"job {name} ({job.scale_factor} GPUs) fits no GPU type")

    return FifoFastestTypePolicy


def run_workload(
    csv_path: Path, interval: int, log_file: Any, progress_every: int
) -> dict[str, Any]:
    import pandas
    import simulator_config as sim_config
    from cluster import Cluster
    from gavel import GavelPolicy

    policy_cls = make_policy_class(GavelPolicy)
    workload = pandas.read_csv(csv_path)
    nnodes = dict(sim_config.cluster_nnodes)
    ngpus_per_node = {k: sim_config.cluster_ngpus_per_node[k] for k in nnodes}
    max_phys = dict(sim_config.cluster_max_physical_nnodes)

    def warn(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    start = time.monotonic()
    with contextlib.redirect_stdout(log_file):
        policy = policy_cls(interval, max_phys, warn=warn)
        cluster = Cluster(workload, policy, nnodes, ngpus_per_node, max_physical_nodes=max_phys)
        cluster.disable_bsz_tuning()
        rounds = 0
        while not cluster.all_complete():
            cluster.step(interval)
            rounds += 1
            if rounds % progress_every == 0:
                done = sum(j.completion_time is not None for j in cluster.jobs)
                warn(
                    f"  {csv_path.name}: round {rounds}, t={cluster.current_time}s, "
                    f"{done}/{len(cluster.jobs)} jobs done, {time.monotonic() - start:.0f}s wall"
                )
    wall = time.monotonic() - start
    jcts = {str(k): float(v) for k, v in cluster.get_jcts().items()}
    done = len(jcts)
    avg_h = sum(jcts.values()) / done / 3600 if done else None
    warn(
        f"{csv_path.name}: {rounds} rounds, {done}/{len(cluster.jobs)} jobs done, "
        f"avg JCT {avg_h:.3f} h, {wall:.0f}s wall"
    )
    return {
        "path": str(csv_path),
        "rounds": rounds,
        "makespan_s": cluster.current_time,
        "jcts_s": jcts,
        "avg_jct_h": avg_h,
        "wall_s": round(wall, 2),
        "placements": {j.name: policy.first_placements.get(j.name) for j in cluster.jobs},
        # Sia counts the first start as restart 0; anything above 0 would be a preemption
        "restarts_total": sum(j.num_restarts or 0 for j in cluster.jobs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path, help="workload CSV file(s)")
    parser.add_argument("--sia", required=True, type=Path, help="the sia-simulator folder")
    parser.add_argument("--interval", type=int, default=60, help="scheduling round, seconds")
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--log", default=os.devnull, help="where the simulator's stdout goes")
    parser.add_argument("--progress-every", type=int, default=200, help="rounds per progress line")
    args = parser.parse_args(argv)

    sia = args.sia.resolve()
    workloads = [p.resolve() for p in args.workloads]
    out = args.out.resolve()
    if not (sia / "cluster.py").is_file():
        parser.error(f"{sia} has no cluster.py")
    # applications.py reads its traces relative to its own file; run from its folder
    sys.path.insert(0, str(sia))
    os.chdir(sia)
    warnings.simplefilter("ignore", FutureWarning)  # pandas DataFrame.append in Sia's code

    import simulator_config as sim_config

    nnodes = dict(sim_config.cluster_nnodes)
    result: dict[str, Any] = {
        "policy": POLICY_NAME,
        "interval_s": args.interval,
        "cluster": {
            "nnodes": nnodes,
            "ngpus_per_node": {k: sim_config.cluster_ngpus_per_node[k] for k in nnodes},
            "max_physical_nodes": {k: sim_config.cluster_max_physical_nnodes[k] for k in nnodes},
        },
        "sia_path": str(sia),
        "workloads": {},
    }
    stems = [p.stem for p in workloads]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "w") as log_file:
        for path in workloads:
            key = path.stem if stems.count(path.stem) == 1 else str(path)
            result["workloads"][key] = run_workload(
                path, args.interval, log_file, max(1, args.progress_every)
            )
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(json.dumps(result, indent=1) + "\n")
            tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
