"""The daemon: a decision loop and the REST API in one process.

Every tick: observe the cluster (``Backend``), let the ``Policy`` choose configs, let the
Planner place the jobs, commit every decision to the database, and only then apply it.
A decision in the database with no ``applied_at`` was decided but not (yet) applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn
from sqlalchemy.orm import Session

from autotune.backend import Backend, ClusterSnapshot, JobStatus, Policy
from autotune.core import Decision, JobConfig, Placement
from autotune.db import Database
from autotune.db import repository as repo
from autotune.log import event
from autotune.planner import plan

__all__ = ["Daemon", "TickReport", "serve"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TickReport:
    time_s: float
    decisions: list[Decision]
    unplaced: dict[str, str]
    duration_s: float
    running: int
    pending: int
    gpu_utilization: float


def _placement_summary(placement: Placement) -> str:
    by_node: dict[str, list[int]] = {}
    for slot in placement.ranks:
        by_node.setdefault(slot.node_id, []).append(slot.gpu_index)
    return ", ".join(f"{node}:{','.join(map(str, gpus))}" for node, gpus in by_node.items())


class Daemon:
    def __init__(self, *, db: Database, backend: Backend, policy: Policy) -> None:
        self.db = db
        self.backend = backend
        self.policy = policy
        # What the job rows last said, so unchanged jobs are not rewritten every tick.
        self._job_rows: dict[str, tuple[str, str, float]] = {}
        self._nodes_written: tuple[object, ...] | None = None
        self._reconciled = False

    def start(self) -> None:
        """Record the active policy version."""
        with self.db.session() as session:
            repo.register_policy_version(
                session=session,
                version=self.policy.version,
                kind=self.policy.name,
                activate=True,
            )
        event("daemon.start", backend=self.backend.name, policy=self.policy.version)

    def tick(self) -> TickReport:
        started = time.perf_counter()
        snapshot = self.backend.observe()
        decisions, unplaced = self._decide(snapshot)
        with self.db.session() as session:  # committed before anything is applied
            if not self._reconciled:
                self._reconcile(session, snapshot)
                self._reconciled = True
            self._write_cluster(session, snapshot, unplaced)
            stored = [repo.create_decision(session=session, decision=d) for d in decisions]
        self.backend.apply(stored)
        with self.db.session() as session:
            repo.mark_decision_applied(
                session=session, decision_ids=[d.decision_id for d in stored if d.decision_id]
            )
            for decision in stored:
                repo.set_job_state(session=session, job_id=decision.job_id, state="running")
                self._job_rows.pop(decision.job_id, None)
            duration = time.perf_counter() - started
            pending_ids = {j.spec.job_id for j in snapshot.by_state("pending")}
            started_now = sum(1 for d in stored if d.job_id in pending_ids)
            running = len(snapshot.by_state("running")) + started_now
            pending = len(pending_ids) - started_now
            repo.record_metrics(
                session=session,
                values=[
                    ("tick_duration_s", duration, None),
                    ("jobs_running", float(running), None),
                    ("jobs_pending", float(pending), None),
                    ("gpu_utilization", snapshot.gpu_utilization, None),
                ],
                labels={"backend": self.backend.name},
            )
        for decision in stored:
            assert decision.placement is not None
            event(
                "decision",
                job=decision.job_id,
                decision_id=decision.decision_id,
                source=decision.source,
                placement=_placement_summary(decision.placement),
                reason=decision.reason,
            )
        for job_id, reason in unplaced.items():
            event("unplaced", level=logging.DEBUG, job=job_id, reason=reason)
        return TickReport(
            time_s=snapshot.time_s,
            decisions=stored,
            unplaced=unplaced,
            duration_s=duration,
            running=running,
            pending=pending,
            gpu_utilization=snapshot.gpu_utilization,
        )

    def _reconcile(self, session: Session, snapshot: ClusterSnapshot) -> None:
        """At the first tick: a job the database holds as pending or running that the
        backend does not know (the daemon restarted, the simulated cluster started
        afresh) is marked failed, with the reason."""
        known = {j.spec.job_id for j in snapshot.jobs}
        for state in ("pending", "running"):
            records, _ = repo.list_jobs(session=session, state=state, limit=1_000_000)
            for record in records:
                if record.spec.job_id in known:
                    continue
                repo.set_job_state(
                    session=session,
                    job_id=record.spec.job_id,
                    state="failed",
                    reason=f"{state} when the daemon stopped; the {self.backend.name} "
                    "backend no longer knows it",
                )
                event("job.lost", job=record.spec.job_id, was=state)

    def _decide(self, snapshot: ClusterSnapshot) -> tuple[list[Decision], dict[str, str]]:
        choices = self.policy.decide(snapshot)
        active = snapshot.by_state("pending", "running")
        configs: dict[str, JobConfig] = {}
        current: dict[str, Placement] = {}
        for job in active:
            job_id = job.spec.job_id
            choice = choices.get(job_id)
            if choice is not None:
                configs[job_id] = choice.config
            elif job.config is not None:
                configs[job_id] = job.config
            if job.placement is not None and configs.get(job_id) == job.config:
                current[job_id] = job.placement
        result = plan([j.spec for j in active], snapshot.nodes, configs, current)
        decisions: list[Decision] = []
        for job in active:
            job_id = job.spec.job_id
            placement = result.placements.get(job_id)
            if placement is None or job_id in result.kept:
                continue
            choice = choices.get(job_id)
            reason = choice.reason if choice else "re-placed: its GPUs are no longer available"
            decisions.append(
                Decision(
                    job_id=job_id,
                    config=configs[job_id],
                    placement=placement,
                    source=choice.source if choice else "policy",
                    policy_version=self.policy.version,
                    reason=f"{reason}; placed on {_placement_summary(placement)}",
                )
            )
        return decisions, result.unplaced

    def _write_cluster(
        self, session: Session, snapshot: ClusterSnapshot, unplaced: dict[str, str]
    ) -> None:
        nodes = tuple(snapshot.nodes)
        if nodes != self._nodes_written:
            repo.upsert_nodes(session=session, nodes=nodes)
            self._nodes_written = nodes
        for job in snapshot.jobs:
            self._write_job(session, job, unplaced.get(job.spec.job_id, ""))
        # Job rows before decision rows: without relationship() the unit of work does not
        # know the foreign key orders them.
        session.flush()

    def _write_job(self, session: Session, job: JobStatus, reason: str) -> None:
        row = (job.state, reason, round(job.progress, 4))
        if self._job_rows.get(job.spec.job_id) == row:
            return
        repo.upsert_job(
            session=session, spec=job.spec, state=job.state, reason=reason, progress=row[2]
        )
        self._job_rows[job.spec.job_id] = row

    async def run(self, stop: asyncio.Event, tick_s: float) -> None:
        """Tick every ``tick_s`` seconds until ``stop`` is set; a tick in progress
        finishes first. A failing tick is logged and the loop goes on."""
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.tick)
            except Exception:
                logging.getLogger("autotune").exception("tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=tick_s)


def serve(daemon: Daemon, *, host: str, port: int, tick_s: float, telemetry: str) -> None:
    """Run the decision loop and the API until SIGINT or SIGTERM."""
    from autotune.api.app import create_app

    app = create_app(db=daemon.db, telemetry=telemetry)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False)
    )
    stop = asyncio.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        # uvicorn handles the signal while it serves and re-raises it afterwards; this
        # handler then turns it into a clean stop instead of a kill.
        server.should_exit = True
        event("daemon.signal", signal=signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    async def _main() -> None:
        loop = asyncio.create_task(daemon.run(stop, tick_s))
        try:
            await server.serve()
        finally:
            stop.set()
            await loop

    daemon.start()
    event("api.listen", url=f"http://{host}:{port}/api/v1")
    try:
        asyncio.run(_main())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        daemon.backend.close()
        daemon.db.dispose()
        event("daemon.stop")
