"""Placement quality and speed of the Planner on the Alibaba GPU cluster trace v2023.

For each pod file: all GPU pods in creation order as one queue, placed on the 1,213 GPU
nodes by the Planner (Hungarian matching in decision rounds) and by first-fit in node
file order. Reports pods placed, GPUs allocated and solve time; checks every assignment
(no GPU, CPU or memory over-committed, type constraints, whole gangs).

    python bench/plan_alibaba.py [--data DIR] [--out FILE]

Deterministic: no randomness is involved, so reruns give the same placements.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from autotune import __version__
from autotune.envs.traces import load_nodes, load_pods
from autotune.planner import PlanResult, first_fit, plan, verify_placements

POD_FILES = ("default", "gpushare40", "gpuspec33", "multigpu20")


def summarise(result: PlanResult, jobs: list, nodes: list) -> dict[str, object]:  # type: ignore[type-arg]
    problems = verify_placements(jobs, nodes, result.placements)
    gpus = sum(slot.gpu_milli for p in result.placements.values() for slot in p.ranks) / 1000
    return {
        "placed": len(result.placements),
        "unplaced": len(result.unplaced),
        "gpus_allocated": round(gpus, 2),
        "solve_s": round(result.solve_s, 2),
        "rounds": result.rounds,
        "valid": not problems,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-v2023"
    parser.add_argument("--data", type=Path, default=default_data)
    parser.add_argument("--out", type=Path, default=Path("bench/out/plan_alibaba.json"))
    args = parser.parse_args()
    nodes = load_nodes(args.data / "openb_node_list_gpu_node.csv.gz")
    report: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "autotune": __version__,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"python {platform.python_version()}",
        "nodes": len(nodes),
        "gpus": sum(n.gpu_count for n in nodes),
        "files": {},
    }
    files: dict[str, object] = {}
    for name in POD_FILES:
        trace = load_pods(args.data / f"openb_pod_list_{name}.csv.gz")
        demand = sum(j.min_gpus * j.gpu_milli for j in trace.jobs) / 1000
        entry = {
            "gpu_pods": len(trace.jobs),
            "gpu_demand": round(demand, 2),
            "hungarian": summarise(plan(trace.jobs, nodes, {}), trace.jobs, nodes),
            "first_fit": summarise(first_fit(trace.jobs, nodes, {}), trace.jobs, nodes),
        }
        files[name] = entry
        print(name, json.dumps(entry), file=sys.stderr, flush=True)
    report["files"] = files
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
