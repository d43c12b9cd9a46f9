"""The learned policy on clusters it never trained on, against ``rules``: named shapes
(Philly's 64 P100, whose GPU model no training drew; 2x8 H100 beside 4x8 V100-16GB, the
mix of a heterogeneous lab) and clusters drawn from ``autotune.envs.presets.drawn_cluster``
with a seed no training uses, each with the built-in job stream sized for it
(``autotune.envs.workloads.scaled_stream``: 60 jobs per 32 GPUs, at most 8x, load 1).

    python bench/unseen_clusters.py [--checkpoint DIR] [--draws 2] [--seeds 2] [--out F]

Every shape is played through the daemon's decision step, as ``autotune eval`` plays a
trace (same jobs and seeds for both policies, 300 s rounds, 32 slots). Prints a table and
one JSON object (``--out`` writes it too, after every shape): per shape its GPUs and
models, and per policy the average JCT, goodput and jobs finished (means over seeds),
and the learned policy's average JCT and goodput relative to ``rules``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.catalog.devices import node_info
from autotune.cli.policy import learned_policies
from autotune.core import NodeInfo
from autotune.envs.presets import drawn_cluster, philly_nodes
from autotune.envs.workloads import scaled_stream
from autotune.policies.evaluate import evaluate_policies

UNSEEN_SEED: Final = 424_242
"""Seeds the drawn shapes; training draws its clusters from other seeds
(``autotune.policies.ppo.DRAWN_CLUSTERS`` from ``[seed, source, 7919]``)."""


def _lab() -> list[NodeInfo]:
    """2 servers of 8 H100 beside 4 of 8 V100-16GB."""

    def make(name: str, model: str, i: int) -> NodeInfo:
        return node_info(
            f"{name}-{i}", gpu_model=model, gpu_count=8, cpu_milli=96_000, memory_mib=768 * 1024
        )

    return [make("h100", "H100", i) for i in range(2)] + [
        make("v100", "V100M16", i) for i in range(4)
    ]


def shapes(draws: int) -> dict[str, Callable[[], list[NodeInfo]]]:
    """The clusters played: the named ones, then ``draws`` drawn ones."""
    out: dict[str, Callable[[], list[NodeInfo]]] = {
        "philly-64xP100": lambda: philly_nodes(64),
        "lab-16xH100+32xV100-16GB": _lab,
    }
    for i in range(draws):
        out[f"drawn-{i}"] = partial(_drawn, i)
    return out


def _drawn(i: int) -> list[NodeInfo]:
    """The ``i``-th drawn shape no training draws."""
    return drawn_cluster(np.random.default_rng([UNSEEN_SEED, i]))


def run(
    *,
    checkpoint: Path | None,
    draws: int,
    seeds: int,
    window: int = 60,
    only: list[str] | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Every shape played (``only``: those named); ``out``: the report so far is written
    there after each shape, so a long run interrupted keeps what it finished."""
    extra = learned_policies(["ppo"], checkpoint=checkpoint, slots=32, round_s=300.0, budget_s=0)
    report: dict[str, Any] = {
        "checkpoint": str(checkpoint or "shipped"),
        "seeds": seeds,
        "window": window,
        "shapes": {},
    }
    for k, (name, build) in enumerate(shapes(draws).items()):
        if only and name not in only:
            continue
        nodes = build()
        gpus = sum(n.gpu_count for n in nodes)
        models = Counter[str]()
        for node in nodes:
            models[node.gpu_model] += node.gpu_count
        jobs = scaled_stream(np.random.default_rng([UNSEEN_SEED, 1_000 + k]), gpus, window=window)
        began = time.perf_counter()
        played = evaluate_policies(
            nodes=nodes,
            jobs=jobs,
            policies=["rules", "ppo"],
            seeds=seeds,
            extra=extra,
            slots=32,
            round_s=300.0,
            trace={"kind": "unseen-cluster", "name": name},
        )
        rows = played["policies"]
        keep = ("avg_jct_s", "goodput", "n_jobs_done")
        entry = {
            "gpus": gpus,
            "models": dict(models),
            "inter_node_gbps": nodes[0].inter_node_bandwidth_gbps,
            "jobs": len(jobs),
            "policies": {p: {m: rows[p][m] for m in keep} for p in ("rules", "ppo")},
            "ppo_jct_vs_rules": rows["ppo"]["avg_jct_s"] / rows["rules"]["avg_jct_s"],
            "ppo_goodput_vs_rules": rows["ppo"]["goodput"] / rows["rules"]["goodput"],
            "wall_s": round(time.perf_counter() - began, 1),
        }
        report["shapes"][name] = entry
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report) + "\n")
        print(
            f"{name}: {gpus} GPUs {dict(models)}, {len(jobs)} jobs; ppo/rules JCT "
            f"{entry['ppo_jct_vs_rules']:.2f}x, goodput {entry['ppo_goodput_vs_rules']:.2f}x",
            file=sys.stderr,
            flush=True,
        )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the shipped")
    parser.add_argument("--draws", type=int, default=2, help="drawn shapes beside the named")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--window", type=int, default=60, help="jobs per 32 GPUs")
    parser.add_argument("--only", default=None, help="comma-separated shape names")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    report = run(
        checkpoint=args.checkpoint,
        draws=args.draws,
        seeds=args.seeds,
        window=args.window,
        only=args.only.split(",") if args.only else None,
        out=args.out,
    )
    columns = ["cluster", "GPUs", "jobs", "rules JCT (s)", "ppo JCT (s)", "JCT ppo/rules"]
    print("| " + " | ".join([*columns, "goodput ppo/rules"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for name, e in report["shapes"].items():
        r, p = e["policies"]["rules"], e["policies"]["ppo"]
        print(
            f"| {name} | {e['gpus']} | {e['jobs']} | {r['avg_jct_s']:,.0f} | {p['avg_jct_s']:,.0f} "
            f"| {e['ppo_jct_vs_rules']:.2f}x | {e['ppo_goodput_vs_rules']:.2f}x |"
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
