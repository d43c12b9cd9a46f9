"""Node loss, end to end: the daemon re-plans a job whose node dies, and the job finishes.

    python bench/recovery.py [--steps 120] [--checkpoint-every 10] [--kill-at 45]
                             [--health-check-ms 500] [--no-comeback] [--json FILE]

A real 3-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head with one
rank slot, two workers with two each; CPU ranks), the daemon (SQLite, the ``ray``
backend, the rules policy) ticking every ``--tick-s``, and the API in-process. A
``gpt-char`` job of 2 to 4 ranks is submitted through the API and trained twice:

1. uninterrupted, to the end: the reference loss curve;
2. again from scratch, and at step ``--kill-at`` the raylet of a worker node that hosts
   ranks of the job is SIGKILLed. Ray declares the node dead, the runner reports it lost,
   the daemon marks it ``lost`` in the database and ``/api/v1/cluster``, places the job
   on the surviving nodes (a smaller layout: 3 slots are left for 4 ranks), and the job
   resumes from its newest checkpoint.

Then (unless ``--no-comeback``) a new node joins and a third job of 4 ranks is placed
with ranks on it: the capacity lost is used again.

Reported (JSON, printed and written to ``--json``): MTTR, the time from the kill to the
first step completed on the new placement, split into detection (kill to ``node_lost``)
and restart; steps redone; both runs' final losses (mean of the last 10 steps) and their
relative difference; the lost node's state in the API; the decision's reason. Ray's
default health check declares a killed raylet dead after about 15 s;
``--health-check-ms`` sets the period of its checks (3 misses declare a node dead; 0
keeps Ray's defaults).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.interfaces import JobMetrics

from autotune.benchmarks import REPO

TOKEN = "recovery-bench"
LAST = 10  # final loss: mean of the last LAST steps


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Kill a Ray node under a running job; measure how the daemon recovers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=120, help="steps of the job")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps per checkpoint")
    parser.add_argument("--kill-at", type=int, default=45, help="kill the node after this step")
    parser.add_argument(
        "--health-check-ms",
        type=int,
        default=500,
        help="Ray's node health-check period (3 misses declare a node dead); 0: Ray's default",
    )
    parser.add_argument("--tick-s", type=float, default=0.5, help="the daemon's tick period")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-comeback", action="store_true", help="skip adding a node back afterwards"
    )
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "out" / "recovery.json", help="output"
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up after this")
    args = parser.parse_args(argv)
    if not 0 < args.kill_at < args.steps:
        parser.error("--kill-at must be between 0 and --steps")
    return args


class _Harness:
    """The daemon, its API and the job's steps as they happen."""

    def __init__(self, cluster: Any, root: Path, args: argparse.Namespace) -> None:
        from fastapi.testclient import TestClient

        from autotune.api.app import attach_daemon, create_app
        from autotune.daemon.auth import TokenCheck, hash_token
        from autotune.daemon.tick import Daemon, DaemonParts
        from autotune.db import Database, sqlite_url
        from autotune.executor.ray_backend import RayBackend
        from autotune.policies.rules import RulesPolicy

        self.args = args
        self.db = Database(sqlite_url(root / "autotune.db"))
        self.db.upgrade()
        self.steps: dict[str, list[tuple[float, int, float | None]]] = {}
        self._lock = threading.Lock()
        self.backend = RayBackend(
            checkpoint_root=root / "checkpoints",
            address=cluster.address,
            checkpoint_every=args.checkpoint_every,
            device="cpu",
            on_step=self._on_step,
        )
        self.daemon = Daemon(DaemonParts(db=self.db, backend=self.backend, policy=RulesPolicy()))
        self.daemon.start()
        app = create_app(db=self.db, telemetry="ray", token_check=TokenCheck([hash_token(TOKEN)]))
        attach_daemon(app, self.daemon)
        self.api = TestClient(app)

    def _on_step(self, job_id: str, step: int, metrics: JobMetrics) -> None:
        loss = metrics.loss
        with self._lock:
            self.steps.setdefault(job_id, []).append((time.time(), step, loss))

    def submit(
        self, job_id: str, *, min_gpus: int, max_gpus: int, steps: int | None = None
    ) -> None:
        response = self.api.post(
            "/api/v1/jobs",
            json={
                "job_id": job_id,
                "task": "gpt-char",
                "steps": steps or self.args.steps,
                "global_batch": 16,
                "min_gpus": min_gpus,
                "max_gpus": max_gpus,
            },
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        if response.status_code != 201:
            raise RuntimeError(f"submitting {job_id}: {response.status_code} {response.text}")

    def get(self, path: str) -> Any:
        response = self.api.get(f"/api/v1{path}")
        response.raise_for_status()
        return response.json()

    def tick_until(
        self, what: str, done: Callable[[], Any], timeout_s: float, during: Callable[[], None]
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.daemon.tick()
            except Exception as exc:  # counted in the daemon's health; the loop goes on
                logging.getLogger("bench").warning("tick failed: %s", exc)
            during()
            result = done()
            if result:
                return result
            time.sleep(self.args.tick_s)
        raise TimeoutError(f"timed out waiting for {what}")

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.get(f"/jobs/{job_id}"))

    def decisions(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.get(f"/decisions?job={job_id}&limit=100")["data"])

    def close(self) -> None:
        self.api.close()
        self.backend.close()
        self.db.dispose()


def _curve(steps: list[tuple[float, int, float | None]]) -> dict[int, float]:
    """Loss by step; a redone step replaces its first try."""
    by_step: dict[int, float] = {}
    for _, step, loss in steps:
        if loss is not None:
            by_step[step] = float(loss)
    return dict(sorted(by_step.items()))


def _final_loss(curve: dict[int, float]) -> float:
    return statistics.fmean(list(curve.values())[-LAST:])


def _ray_id(node: Any) -> str:
    """Ray's node id of a ``ray.cluster_utils`` node (matched by its raylet's port)."""
    import ray

    for entry in ray.nodes():  # type: ignore[no-untyped-call]
        if entry["Alive"] and entry["NodeManagerPort"] == node.node_manager_port:
            return str(entry["NodeID"])
    raise RuntimeError(f"no alive Ray node has raylet port {node.node_manager_port}")


def _kill_raylet(node: Any) -> int:
    raylet = node.all_processes["raylet"][0].process
    os.kill(raylet.pid, signal.SIGKILL)
    return int(raylet.pid)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from autotune.executor.cluster import ray_node_id

    system_config: dict[str, Any] = {}
    if args.health_check_ms:
        system_config = {
            "health_check_period_ms": args.health_check_ms,
            "health_check_failure_threshold": 3,
        }
    head_args: dict[str, Any] = {"num_cpus": 1}
    if system_config:
        head_args["_system_config"] = system_config
    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    result: dict[str, Any] = {}
    harness: _Harness | None = None
    root = Path(tempfile.mkdtemp(prefix="autotune-recovery-"))
    try:
        workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
        cluster.wait_for_nodes()
        result["cluster_start_s"] = round(time.perf_counter() - started, 1)
        harness = _Harness(cluster, root, args)
        h = harness
        deadline = time.monotonic() + args.timeout_s

        def finished(job_id: str) -> Callable[[], Any]:
            return lambda: (j := h.job(job_id))["state"] in ("finished", "failed") and j

        # 1. The reference: the same job, never interrupted.
        h.submit("reference", min_gpus=2, max_gpus=4)
        ref = h.tick_until(
            "the reference job", finished("reference"), deadline - time.monotonic(), lambda: None
        )
        if ref["state"] != "finished":
            raise RuntimeError(f"the reference job failed: {ref['state_reason']}")
        ref_layout = h.decisions("reference")[-1]["config"]["layout"]

        # 2. The same job; a node under it is killed at --kill-at.
        killed: dict[str, Any] = {}

        def kill_when_due() -> None:
            if killed:
                return
            with h._lock:
                done = [s for _, s, _ in h.steps.get("victim", [])]
            if not done or max(done) < args.kill_at:
                return
            placement = h.decisions("victim")[0]["placement"]
            names = sorted({slot["node_id"] for slot in placement["ranks"]})
            by_id = {_ray_id(w): w for w in workers}
            victim = next(n for n in names if ray_node_id(n) in by_id)
            killed["at"] = time.time()
            killed["node"] = victim
            killed["step"] = max(done)
            killed["raylet_pid"] = _kill_raylet(by_id[ray_node_id(victim)])
            killed["cluster_node"] = by_id[ray_node_id(victim)]

        h.submit("victim", min_gpus=2, max_gpus=4)
        victim = h.tick_until(
            "the interrupted job", finished("victim"), deadline - time.monotonic(), kill_when_due
        )
        if not killed:
            raise RuntimeError("the job finished before the node was killed: lower --kill-at")
        events = h.backend.job_events("victim")
        lost = next(e for e in events if e["kind"] == "node_lost")
        resumed = next(e for e in events if e["kind"] == "resumed")
        decisions = h.decisions("victim")
        replaced = next(d for d in decisions if "lost" in d["reason"])
        cluster_view = h.get("/cluster")
        lost_node = next(n for n in cluster_view["nodes"] if n["node_id"] == killed["node"])
        with h._lock:
            ref_steps, victim_steps = list(h.steps["reference"]), list(h.steps["victim"])
        ref_curve, victim_curve = _curve(ref_steps), _curve(victim_steps)
        ref_loss, victim_loss = _final_loss(ref_curve), _final_loss(victim_curve)
        result.update(
            {
                "job_state": victim["state"],
                "steps": args.steps,
                "checkpoint_every": args.checkpoint_every,
                "killed_node": killed["node"],
                "killed_after_step": killed["step"],
                "layout_before": decisions[-1]["config"]["layout"],
                "layout_after": replaced["config"]["layout"],
                "reference_layout": ref_layout,
                "placement_after": sorted({s["node_id"] for s in replaced["placement"]["ranks"]}),
                "detect_s": round(lost["at"] - killed["at"], 2),
                "mttr_s": round(resumed["at"] - killed["at"], 2),
                "restart_s": round(resumed["at"] - lost["at"], 2),
                "steps_redone": resumed["steps_redone"],
                "resumed_from_step": resumed["resumed_from"],
                "final_loss_reference": round(ref_loss, 4),
                "final_loss_interrupted": round(victim_loss, 4),
                "final_loss_rel_diff": round(abs(victim_loss - ref_loss) / ref_loss, 4),
                "loss_curve_reference": [round(v, 4) for v in ref_curve.values()],
                "loss_curve_interrupted": [round(v, 4) for v in victim_curve.values()],
                "decision_reason": replaced["reason"],
                "lost_node_state": lost_node["state"],
                "lost_node_lost_at": lost_node["lost_at"],
            }
        )

        # 3. A node joins: a 4-rank job is placed with ranks on it.
        if not args.no_comeback:
            before = {n["node_id"] for n in h.get("/cluster")["nodes"]}
            # The rest of the killed node's processes go first (its raylet is dead already).
            cluster.remove_node(killed["cluster_node"], allow_graceful=False)
            cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            h.submit("after", min_gpus=4, max_gpus=4, steps=5)
            after = h.tick_until(
                "a job on the node that joined",
                finished("after"),
                deadline - time.monotonic(),
                lambda: None,
            )
            placed = h.decisions("after")[-1]["placement"]["ranks"]
            nodes_after = {n["node_id"]: n for n in h.get("/cluster")["nodes"]}
            joined = sorted(set(nodes_after) - before)
            result["comeback"] = {
                "joined": joined,
                "job_state": after["state"],
                "placed_on": sorted({s["node_id"] for s in placed}),
                "uses_joined": bool(set(joined) & {s["node_id"] for s in placed}),
            }
        result["wall_s"] = round(time.perf_counter() - started, 1)
    finally:
        if harness is not None:
            harness.close()
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    return result


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = run(args)
    out = {
        "benchmark": "recovery",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(["python", "bench/recovery.py", *(argv or sys.argv[1:])]),
        "health_check_ms": args.health_check_ms or "ray default",
        **result,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
