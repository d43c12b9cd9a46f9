"""The testbed's links are real: all-reduce time against the bandwidth bound.

    python bench/testbed_links.py [--mbit 100] [--sizes-mib 1 4 16] [--steps 20]
                                  [--json bench/out/testbed_links.json]

Two machines of the testbed (``autotune.benchmarks.testbed``: network namespaces on a
link shaped with ``tbf`` to ``--mbit`` Mbit/s each way, each running ``ray start``):

1. **All-reduce of known bytes.** ``autotune cluster describe --mib SIZE`` on the head,
   as a user describes a cluster: a Ray actor on each machine joins a gloo group over
   the link and times ``all_reduce`` of SIZE MiB of fp32 (median of 5 after one warm-up,
   ``autotune.executor.links``), for each of ``--sizes-mib``. The bound for a ring of n
   ranks is 2·(n−1)/n · bytes · 8 / rate.
2. **A training step.** ``autotune job run --task gpt-char --dp 2`` across the two
   machines, the driver on the head: dense on the shaped link, dense on the unshaped link
   (the step's compute: the link is a veth pair, GB/s), and top-k 1% on the shaped link.
   The dense step's all-reduce is the shaped step minus the unshaped one; it is set
   against the bound for the gradient's bytes, and the shaped step against compute plus
   that bound.

Everything is printed and written as JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO
from autotune.benchmarks.testbed import Testbed


def ring_bound_s(nbytes: float, ranks: int, mbit: float) -> float:
    """A ring all-reduce's time on links of ``mbit`` Mbit/s each way: every rank sends
    and receives 2·(n−1)/n of the buffer."""
    return 2 * (ranks - 1) / ranks * nbytes * 8 / (mbit * 1e6)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure all-reduce and training steps across testbed machines "
        "against the bandwidth bound.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--mbit", type=float, default=100.0, help="link bandwidth, Mbit/s")
    parser.add_argument(
        "--sizes-mib", type=float, nargs="+", default=[1.0, 4.0, 16.0], help="all-reduce sizes"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps of each training run")
    parser.add_argument(
        "--no-train", action="store_true", help="measure the all-reduce only, not the job"
    )
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "out" / "testbed_links.json", help="output"
    )
    args = parser.parse_args(argv)
    if args.mbit <= 0 or min(args.sizes_mib) <= 0 or args.steps < 2:
        parser.error("--mbit and --sizes-mib must be > 0, --steps >= 2")
    return args


def _all_reduce(bed: Testbed, sizes: list[float]) -> dict[str, float]:
    """The seconds of an all-reduce of each size between the two machines, as
    ``autotune cluster describe`` measures the link (run on the head, as a user would)."""
    autotune = str(Path(sys.executable).with_name("autotune"))
    out: dict[str, float] = {}
    for mib in sizes:
        target = bed.root / f"cluster-{mib:g}.json"
        argv = [
            autotune, "cluster", "describe", "--ray-address", bed.ray_address,
            "--mib", str(mib), "--out", str(target), "--json",
        ]  # fmt: skip
        done = bed.call("head", argv, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"`autotune cluster describe` failed: {done.stderr[-3000:]}")
        (link,) = json.loads(done.stdout)["links"]
        out[str(mib)] = link["bytes"] / (link["gbps"] * 1e9)
    return out


def _job(bed: Testbed, steps: int, compression: str) -> dict[str, Any]:
    autotune = str(Path(sys.executable).with_name("autotune"))
    argv = [
        autotune, "job", "run", "--task", "gpt-char", "--dp", "2", "--steps", str(steps),
        "--compression", compression, "--ray-address", bed.ray_address, "--json",
    ]  # fmt: skip
    done = bed.call("head", argv, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(
            f"`autotune job run --compression {compression}` failed: {done.stderr[-3000:]}"
        )
    summary: dict[str, Any] = json.loads(done.stdout)
    nodes = {p["node"] for p in summary["placement"]}
    if len(nodes) != 2:
        raise RuntimeError(f"the job's ranks did not span both machines: {sorted(nodes)}")
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"mbit": args.mbit}
    with Testbed(2, mbit=args.mbit, cpus=1) as bed:
        result["testbed_built_s"] = round(bed.built_s, 2)
        ranks = 2
        reduce = _all_reduce(bed, args.sizes_mib)
        result["all_reduce"] = []
        for size, seconds in reduce.items():
            bound = ring_bound_s(float(size) * 2**20, ranks, args.mbit)
            result["all_reduce"].append(
                {
                    "mib": float(size),
                    "measured_s": round(seconds, 4),
                    "bound_s": round(bound, 4),
                    "ratio": round(seconds / bound, 3),
                    "effective_mbit": round(
                        2 * (ranks - 1) / ranks * float(size) * 2**20 * 8 / seconds / 1e6, 1
                    ),
                }
            )
        if args.no_train:
            return result
        dense = _job(bed, args.steps, "none")
        topk = _job(bed, args.steps, "topk:0.01")
        for m in (bed.head, *bed.workers):
            bed.shape(m, None)
        compute = _job(bed, args.steps, "none")
    grad_bytes = dense["bytes_dense"] / dense["steps"] / ranks
    bound = ring_bound_s(grad_bytes, ranks, args.mbit)
    step, step_compute = dense["step_time_s_median"], compute["step_time_s_median"]
    comm = step - step_compute
    result["training"] = {
        "task": "gpt-char",
        "dp": ranks,
        "steps": args.steps,
        "gradient_bytes_per_rank": int(grad_bytes),
        "step_s_dense_shaped": round(step, 4),
        "step_s_dense_unshaped": round(step_compute, 4),
        "step_s_topk1pct_shaped": round(topk["step_time_s_median"], 4),
        "topk_bytes_sent_fraction": round(topk["bytes_sent"] / topk["bytes_dense"], 4),
        "all_reduce_s": round(comm, 4),
        "all_reduce_bound_s": round(bound, 4),
        "all_reduce_ratio": round(comm / bound, 3),
        # What the ranks measured themselves: the synchronisation backward did not hide
        # (DDP overlaps its all-reduce with backward, so at most the bound).
        "sync_s_dense_shaped": dense["sync_time_s_median"],
        "communication_share_dense_shaped": dense["communication_share"],
        "communication_share_topk1pct_shaped": topk["communication_share"],
        "step_over_compute_plus_bound": round(step / (step_compute + bound), 3),
        "speedup_topk_over_dense": round(step / topk["step_time_s_median"], 2),
        "loss_last_dense": dense["loss_last"],
        "loss_last_topk": topk["loss_last"],
        "nodes": sorted({p["node"] for p in dense["placement"]}),
    }
    return result


def within(ratio: float, tolerance: float = 0.2) -> bool:
    return abs(ratio - 1) <= tolerance


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    result = run(args)
    goals = {
        "all_reduce_within_20pct": all(within(r["ratio"]) for r in result["all_reduce"]),
    }
    if "training" in result:
        t = result["training"]
        goals["step_all_reduce_within_20pct"] = within(t["all_reduce_ratio"])
        goals["step_within_20pct_of_compute_plus_bound"] = within(t["step_over_compute_plus_bound"])
    out = {
        "benchmark": "testbed_links",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(["python", "bench/testbed_links.py", *(argv or sys.argv[1:])]),
        **result,
        "goals": goals,
        "median_note": "all-reduce: median of 5 timed repeats, slowest rank; "
        "steps: the job's median step",
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
