"""A machine lost under a running job: the daemon re-plans it, and the job finishes.

    python bench/recovery.py [--fault kill|partition] [--partition-s 60] [--steps 120]
                             [--checkpoint-every 10] [--fault-at 45] [--mbit 1000]
                             [--health-check-ms 500] [--json FILE]

On the testbed (``autotune.benchmarks.testbed``: three machines of network namespaces on
links of ``--mbit`` Mbit/s, each running ``ray start`` with token authentication; a head
with one CPU rank slot, two workers with two each): the daemon (SQLite, the ``ray``
backend, the rules policy) runs on the head machine, ticking every ``--tick-s``, with its
API in-process. A ``gpt-char`` job of 2 to 4 ranks is submitted through the API and
trained twice:

1. uninterrupted, to the end: the reference loss curve;
2. again from scratch, and after step ``--fault-at`` a worker machine that hosts ranks of
   the job fails: ``kill`` SIGKILLs every process on it (a power cut); ``partition`` takes
   its link down for ``--partition-s`` seconds and then heals it. Ray declares the node
   dead, the runner reports it lost, the daemon marks it ``lost`` in the database and
   ``/api/v1/cluster``, places the job on the surviving machines (a smaller layout: 3
   slots are left for 4 ranks), and the job resumes from its newest checkpoint.

3. The machine comes back: a Ray node the cluster declared dead does not rejoin (its
   raylet exits when it learns so: reported as ``rejoined_by_itself`` after a partition),
   so the machine's Ray is started again, and a job of 4 ranks is placed with ranks on it.

Reported (JSON, printed and written to ``--json``): MTTR, the time from the fault to the
first step completed on the new placement, split into detection (fault to ``node_lost``)
and restart; steps redone; both runs' final losses (mean of the last 10 steps) and their
relative difference; the lost node's state in the API; the decision's reason; whether
every checkpoint written still loads. Ray's default health check declares a dead node
after about 15 s; ``--health-check-ms`` sets the period and timeout of its checks (3
misses declare a node dead; 0 keeps Ray's defaults).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.interfaces import JobMetrics

from autotune.benchmarks import REPO
from autotune.benchmarks.testbed import Machine, Testbed

TOKEN = "recovery-bench"
LAST = 10  # final loss: mean of the last LAST steps


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Kill a Ray node under a running job; measure how the daemon recovers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=120, help="steps of the job")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps per checkpoint")
    parser.add_argument(
        "--fault", choices=["kill", "partition"], default="kill", help="what happens to a machine"
    )
    parser.add_argument("--fault-at", type=int, default=45, help="the fault after this step")
    parser.add_argument(
        "--partition-s", type=float, default=60.0, help="how long a partition lasts"
    )
    parser.add_argument("--mbit", type=float, default=1000.0, help="the links' Mbit/s")
    parser.add_argument(
        "--health-check-ms",
        type=int,
        default=500,
        help="Ray's node health-check period (3 misses declare a node dead); 0: Ray's default",
    )
    parser.add_argument("--tick-s", type=float, default=0.5, help="the daemon's tick period")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "out" / "recovery.json", help="output"
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up after this")
    args = parser.parse_args(argv)
    if not 0 < args.fault_at < args.steps:
        parser.error("--fault-at must be between 0 and --steps")
    if args.partition_s <= 0 or args.mbit <= 0:
        parser.error("--partition-s and --mbit must be > 0")
    return args


class DaemonHarness:
    """The daemon (``policy``: the rules by default), its API and the jobs' steps as they
    happen, in this process, on the Ray cluster at ``address`` (``cluster``: its
    description, ``autotune.catalog.clusters``, as ``--cluster-file`` gives it)."""

    def __init__(
        self,
        address: str,
        root: Path,
        *,
        checkpoint_every: int,
        tick_s: float,
        policy: Any = None,
        steps: int = 100,
        cluster: Any = None,
    ) -> None:
        from fastapi.testclient import TestClient

        from autotune.api.app import attach_daemon, create_app
        from autotune.daemon.auth import TokenCheck, hash_token
        from autotune.daemon.tick import Daemon, DaemonParts
        from autotune.db import Database, sqlite_url
        from autotune.executor.ray_backend import RayBackend
        from autotune.policies.rules import RulesPolicy

        self.tick_s, self.default_steps = tick_s, steps
        self.db = Database(sqlite_url(root / "autotune.db"))
        self.db.upgrade()
        self.steps: dict[str, list[tuple[float, int, float | None]]] = {}
        self._lock = threading.Lock()
        self.backend = RayBackend(
            checkpoint_root=root / "checkpoints",
            address=address,
            checkpoint_every=checkpoint_every,
            device="cpu",
            on_step=self._on_step,
            cluster=cluster,
        )
        self.daemon = Daemon(
            DaemonParts(
                db=self.db,
                backend=self.backend,
                policy=policy if policy is not None else RulesPolicy(),
                fallback=RulesPolicy(),
            )
        )
        self.daemon.start()
        app = create_app(db=self.db, telemetry="ray", token_check=TokenCheck([hash_token(TOKEN)]))
        attach_daemon(app, self.daemon)
        self.api = TestClient(app)

    def steps_of(self, job_id: str) -> list[tuple[float, int, float | None]]:
        """``(time, step, loss)`` of every step of the job so far."""
        with self._lock:
            return list(self.steps.get(job_id, []))

    def _on_step(self, job_id: str, step: int, metrics: JobMetrics) -> None:
        loss = metrics.loss
        with self._lock:
            self.steps.setdefault(job_id, []).append((time.time(), step, loss))

    def submit(
        self,
        job_id: str,
        *,
        min_gpus: int,
        max_gpus: int,
        steps: int | None = None,
        task: str = "gpt-char",
        global_batch: int = 16,
    ) -> None:
        response = self.api.post(
            "/api/v1/jobs",
            json={
                "job_id": job_id,
                "task": task,
                "steps": steps or self.default_steps,
                "global_batch": global_batch,
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
            time.sleep(self.tick_s)
        raise TimeoutError(f"timed out waiting for {what}")

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.get(f"/jobs/{job_id}"))

    def decisions(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.get(f"/decisions?job={job_id}&limit=100")["data"])

    def cancel(self, job_id: str) -> None:
        response = self.api.delete(
            f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        if response.status_code not in (202, 409):  # 409: it ended already
            raise RuntimeError(f"cancelling {job_id}: {response.status_code} {response.text}")

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


def _machine_of(bed: Testbed, name: str) -> Machine:
    """The testbed machine of a node the daemon names ``name``."""
    import ray

    from autotune.executor.cluster import ray_node_id

    ray_id = ray_node_id(name)
    for entry in ray.nodes():  # type: ignore[no-untyped-call]
        if entry["NodeID"] == ray_id:
            return bed.machine(str(entry["NodeManagerAddress"]))
    raise RuntimeError(f"Ray knows no node {name} ({ray_id})")


def _alive_on(address: str) -> bool:
    import ray

    return any(
        e["Alive"] and e["NodeManagerAddress"] == address
        for e in ray.nodes()  # type: ignore[no-untyped-call]
    )


def _checkpoints(root: Path) -> dict[str, Any]:
    """Every checkpoint the jobs wrote, and whether each one loads."""
    import torch

    files = sorted(p for p in (root / "checkpoints").rglob("*") if p.is_file())
    bad = []
    for path in files:
        if path.suffix not in (".pt", ".pth"):
            continue
        try:
            torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:
            bad.append(f"{path.relative_to(root)}: {type(exc).__name__}: {exc}")
    partial = [str(p.relative_to(root)) for p in files if p.suffix == ".tmp"]
    return {"files": len(files), "unreadable": bad, "partial": partial}


def run(args: argparse.Namespace) -> dict[str, Any]:
    system_config: dict[str, Any] = {}
    if args.health_check_ms:
        system_config = {
            "health_check_period_ms": args.health_check_ms,
            "health_check_timeout_ms": args.health_check_ms,
            "health_check_failure_threshold": 3,
        }
    started = time.perf_counter()
    bed = Testbed(3, mbit=args.mbit, cpus=[1, 2, 2], system_config=system_config)
    result: dict[str, Any] = {"testbed_built_s": round(bed.built_s, 2), "mbit": args.mbit}
    harness: DaemonHarness | None = None
    root = bed.root / "daemon"
    root.mkdir()
    try:
        with bed.client("head"):  # the daemon runs on the head machine, as a user's would
            import ray  # after ``client`` sets RAY_AUTH_MODE: Ray reads it on import

            harness = DaemonHarness(
                bed.ray_address,
                root,
                checkpoint_every=args.checkpoint_every,
                tick_s=args.tick_s,
                steps=args.steps,
            )
            _scenario(bed, harness, args, result, root)
            result["wall_s"] = round(time.perf_counter() - started, 1)
            harness.close()
            harness = None
            if ray.is_initialized():
                ray.shutdown()
    finally:
        if harness is not None:
            harness.close()
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        bed.close()
    return result


def _scenario(
    bed: Testbed, h: DaemonHarness, args: argparse.Namespace, result: dict[str, Any], root: Path
) -> None:
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

    # 2. The same job; a worker machine under it fails after --fault-at.
    fault: dict[str, Any] = {}

    def inject_when_due() -> None:
        if fault.get("healed_at") or (fault and args.fault == "kill"):
            return
        if fault:  # partitioned: heal once --partition-s has passed
            if time.time() - fault["at"] >= args.partition_s:
                bed.heal(fault["machine"])
                fault["healed_at"] = time.time()
            return
        with h._lock:
            done = [s for _, s, _ in h.steps.get("victim", [])]
        if not done or max(done) < args.fault_at:
            return
        placement = h.decisions("victim")[0]["placement"]
        names = sorted({slot["node_id"] for slot in placement["ranks"]})
        machines = {name: _machine_of(bed, name) for name in names}
        victim = next(n for n in names if not machines[n].is_head)
        fault.update(node=victim, machine=machines[victim].name, step=max(done), at=time.time())
        if args.fault == "kill":
            fault["pids_killed"] = len(bed.kill(machines[victim]))
        else:
            bed.partition(machines[victim])

    h.submit("victim", min_gpus=2, max_gpus=4)
    victim = h.tick_until(
        "the interrupted job", finished("victim"), deadline - time.monotonic(), inject_when_due
    )
    if not fault:
        raise RuntimeError("the job finished before the fault: lower --fault-at")
    if args.fault == "partition" and "healed_at" not in fault:
        # The job finished on the survivors before the partition was over.
        remaining = args.partition_s - (time.time() - fault["at"])
        time.sleep(max(0.0, remaining))
        bed.heal(fault["machine"])
        fault["healed_at"] = time.time()
    events = h.backend.job_events("victim")
    lost = next(e for e in events if e["kind"] == "node_lost")
    resumed = next(e for e in events if e["kind"] == "resumed")
    decisions = h.decisions("victim")
    replaced = next(d for d in decisions if "lost" in d["reason"])
    cluster_view = h.get("/cluster")
    lost_node = next(n for n in cluster_view["nodes"] if n["node_id"] == fault["node"])
    with h._lock:
        ref_steps, victim_steps = list(h.steps["reference"]), list(h.steps["victim"])
    ref_curve, victim_curve = _curve(ref_steps), _curve(victim_steps)
    ref_loss, victim_loss = _final_loss(ref_curve), _final_loss(victim_curve)
    result.update(
        {
            "fault": args.fault,
            "job_state": victim["state"],
            "steps": args.steps,
            "checkpoint_every": args.checkpoint_every,
            "failed_node": fault["node"],
            "failed_machine": fault["machine"],
            "failed_after_step": fault["step"],
            "layout_before": decisions[-1]["config"]["layout"],
            "layout_after": replaced["config"]["layout"],
            "reference_layout": ref_layout,
            "placement_after": sorted({s["node_id"] for s in replaced["placement"]["ranks"]}),
            "detect_s": round(lost["at"] - fault["at"], 2),
            "mttr_s": round(resumed["at"] - fault["at"], 2),
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
    if args.fault == "partition":
        result["partition_s"] = round(fault["healed_at"] - fault["at"], 1)
        result["finished_during_partition"] = victim_steps[-1][0] < fault["healed_at"]

    # 3. The machine comes back. A Ray node that the cluster declared dead never rejoins
    # (its raylet exits once it hears so); the machine's Ray is started again, as a
    # cluster manager would, and a 4-rank job is placed with ranks on the new node.
    machine = bed.machine(fault["machine"])
    if args.fault == "partition":
        waited = time.monotonic()
        while time.monotonic() - waited < 30 and not _alive_on(machine.address):
            time.sleep(0.5)  # the healed raylet rejoining by itself, if Ray allowed it
        result["rejoined_by_itself"] = _alive_on(machine.address)
        result["processes_left_after_heal"] = len(bed.pids(machine))
    if not _alive_on(machine.address):
        bed.kill(machine)  # what is left of the old node's processes
        bed.restart(machine)
    before = {n["node_id"] for n in h.get("/cluster")["nodes"]}
    h.submit("after", min_gpus=4, max_gpus=4, steps=5)
    after = h.tick_until(
        "a job on the machine that came back",
        finished("after"),
        deadline - time.monotonic(),
        lambda: None,
    )
    placed = h.decisions("after")[-1]["placement"]["ranks"]
    nodes_after = {n["node_id"]: n for n in h.get("/cluster")["nodes"]}
    joined = sorted(set(nodes_after) - before)
    placed_on = {s["node_id"] for s in placed}
    result["comeback"] = {
        "joined": joined,
        "job_state": after["state"],
        "placed_on": sorted(placed_on),
        "uses_joined": bool(set(joined) & placed_on),
        "uses_machine": any(_machine_of(bed, name).name == machine.name for name in placed_on),
    }
    result["checkpoints"] = _checkpoints(root)


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
