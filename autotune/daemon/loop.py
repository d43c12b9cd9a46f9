"""The daemon: a decision loop and the REST API in one process.

Every tick: observe the cluster (``Backend``), take the round's decisions with the pure
decision step (``autotune.daemon.decide``: the ``Policy``, the active overrides and the
Planner), commit every decision to the database, and only then apply it.
A decision in the database with no ``applied_at`` was decided but not (yet) applied.

A failing tick is counted (``Daemon.health``: ``GET /readyz`` answers 503 naming it,
``/metrics`` counts it). After ``FALLBACK_AFTER`` failed ticks in a row the daemon
decides with its fallback policy (``Daemon(fallback=...)``, the rules where the command
line assembles it) whenever its own policy fails: each tick still asks its own policy
first, and the first tick that its own policy decides and that completes ends the
fallback. Decisions the fallback takes have ``source="fallback"`` and say why.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import FrameType
from typing import Any, Protocol

import uvicorn
from sqlalchemy.orm import Session

from autotune.core import Decision, utc_now
from autotune.daemon.decide import DecisionRound, decide, placement_summary
from autotune.daemon.log import event
from autotune.daemon.performance import JobModel, JobModels
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.retention import RetentionPolicy, run_retention
from autotune.interfaces import (
    Backend,
    ClusterSnapshot,
    JobControl,
    JobStatus,
    JobSubmission,
    Policy,
    PolicyChoice,
)
from autotune.perf.model import statistical_efficiency
from autotune.provisioning import Provisioner, ProvisioningPlan

__all__ = [
    "FALLBACK_AFTER",
    "Daemon",
    "Lifecycle",
    "Recorder",
    "TickHealth",
    "TickReport",
    "serve",
]

FALLBACK_AFTER = 3
"""Failed ticks in a row after which the daemon decides with its fallback policy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TickReport:
    time_s: float
    decisions: list[Decision]
    unplaced: dict[str, str]
    duration_s: float
    running: int
    pending: int
    gpu_utilization: float
    fallback: bool = False
    """The fallback policy decided this tick: the daemon's own policy failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TickHealth:
    """How the decision loop is doing: what ``GET /readyz`` and ``/metrics`` report."""

    consecutive_failures: int = 0
    """Failed ticks in a row; a tick decided by the daemon's own policy resets it (a tick
    the fallback decided leaves it as it is)."""
    failures_total: int = 0
    """Failed ticks since the daemon started."""
    last_error: str | None = None
    """``Type: message`` of the newest failure: of a tick, or of the daemon's own policy
    in a tick the fallback then decided."""
    last_failure_at: datetime | None = None
    fallback: str | None = None
    """The fallback policy's name while the daemon decides with it; ``None``: it does
    not."""

    @property
    def ok(self) -> bool:
        """The last tick succeeded and the daemon's own policy decided it."""
        return self.consecutive_failures == 0 and self.fallback is None

    def describe(self) -> str | None:
        """Why the loop is not ok, in words; ``None`` when it is."""
        if self.ok:
            return None
        text = f"{self.consecutive_failures} consecutive failed tick(s); last error: "
        text += str(self.last_error)
        if self.fallback is not None:
            text += f"; deciding with the fallback policy {self.fallback}"
        return text


class Recorder(Protocol):
    """What the decision loop asks of the transition log each tick (in the transaction
    that commits the round's decisions) and when it stops."""

    def record(
        self,
        session: Session,
        *,
        policy: Policy | None,
        backend: Backend,
        snapshot: ClusterSnapshot,
        round_: DecisionRound,
        overrides: dict[str, repo.OverrideRecord],
        stored: list[Decision],
    ) -> None:
        """Measure the previous round (the backend ran it before ``snapshot``), then log
        this one if ``policy`` (``None``: the fallback decided) acted on it."""

    def close(self, session: Session) -> None:
        """The loop stopped: the round logged last will never be measured."""


class Lifecycle(Protocol):
    """What the decision loop asks of the policy registry each tick."""

    def before_tick(self, daemon: Daemon) -> None:
        """Swap ``daemon.policy`` if another version was activated (never raises for a
        checkpoint that cannot load: it logs and keeps the current policy)."""

    def after_decide(
        self,
        daemon: Daemon,
        snapshot: ClusterSnapshot,
        overrides: dict[str, repo.OverrideRecord],
        round_: DecisionRound,
    ) -> None:
        """Let the shadow policy, if any, decide the same round and store its choices
        (never applied)."""


def _error(exc: BaseException) -> str:
    """``Type: message`` (the message cut at 500 characters)."""
    message = str(exc)
    if len(message) > 500:
        message = message[:497] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class _Fallback:
    """The fallback policy as the decision step sees it: its choices say
    ``source="fallback"`` and why, before its own reason."""

    def __init__(self, policy: Policy, why: str) -> None:
        self._policy = policy
        self._why = why
        self.name = policy.name
        self.version = policy.version

    def decide(self, snapshot: ClusterSnapshot) -> dict[str, PolicyChoice]:
        return {
            job_id: replace(choice, source="fallback", reason=f"{self._why}: {choice.reason}")
            for job_id, choice in self._policy.decide(snapshot).items()
        }


class Daemon:
    def __init__(
        self,
        *,
        db: Database,
        backend: Backend,
        policy: Policy,
        fallback: Policy | None = None,
    ) -> None:
        """``fallback`` decides when ``policy`` fails after ``FALLBACK_AFTER`` failed
        ticks in a row (``None``: failed ticks are only counted)."""
        self.db = db
        self.backend = backend
        self.policy = policy
        self.fallback = fallback
        # Replaced, never changed in place, by the decision loop's thread: other threads
        # (the API's) read it without a lock.
        self._health = TickHealth()
        # What the job rows last said, so unchanged jobs are not rewritten every tick.
        self._job_rows: dict[str, tuple[object, ...]] = {}
        self._nodes_written: tuple[object, ...] | None = None
        self._reconciled = False
        self._started_at = utc_now()
        # Jobs the backend knows, and per active job the override its newest decision
        # honoured (None: the policy's); both rebuilt from the database at start().
        self._known: set[str] = set()
        self._honoured: dict[str, int | None] = {}
        self.tick_observers: list[Callable[[TickReport], None]] = []
        """Called with the report of every tick that succeeded."""
        self.after_tick: list[Callable[[], None]] = []
        """Called after every tick, failed or not, once what it committed is visible."""
        self.transitions: Recorder | None = None
        """Where the learned policy's rounds are logged for offline learning
        (``autotune.replay.log.TransitionLog``); ``None``: not logged."""
        self.models = JobModels()
        """Each running job's throughput model, fitted online from its measured steps."""
        self._models_now: dict[str, JobModel] = {}
        self.lifecycle: Lifecycle | None = None
        """The policy registry's hand on the loop (``autotune.daemon.lifecycle``): it may
        swap ``policy`` before a tick decides, and lets a shadow policy decide beside it."""
        self.provisioner: Provisioner | None = None
        """Parks idle nodes the demand forecast does not need (``autotune.provisioning``):
        on a backend that can (``park``/``wake``: the simulator) before the tick decides;
        elsewhere its plan is a recommendation, in the log and the metrics."""
        self._provisioned: ProvisioningPlan | None = None
        """The provisioner's newest plan."""

    @property
    def health(self) -> TickHealth:
        """How the decision loop is doing (safe to read from any thread)."""
        return self._health

    def start(self) -> None:
        """Record the active policy version (and the fallback's); resume the database's
        active jobs on a backend that can (``JobControl``)."""
        self._started_at = utc_now()
        with self.db.session() as session:
            if self.fallback is not None:
                repo.register_policy_version(
                    session=session, version=self.fallback.version, kind=self.fallback.name
                )
            repo.register_policy_version(
                session=session,
                version=self.policy.version,
                kind=self.policy.name,
                activate=True,
            )
            resumed = self._restore(session)
            if self.transitions is not None:
                # Rounds a stopped run logged but never measured end their episodes.
                repo.truncate_open_transitions(session=session)
        event(
            "daemon.start", backend=self.backend.name, policy=self.policy.version, resumed=resumed
        )

    def _restore(self, session: Session) -> int:
        active = repo.active_jobs(session=session)
        latest = repo.latest_decision_records(
            session=session, job_ids=[r.spec.job_id for r in active]
        )
        self._honoured = {job_id: record.override_id for job_id, record in latest.items()}
        if not isinstance(self.backend, JobControl):
            return 0
        jobs: list[tuple[JobSubmission, JobStatus]] = []
        for record in active:
            task = record.task or {}
            if not task.get("name") or not task.get("steps"):
                continue  # the backend never said what it trains: _reconcile fails it
            last = latest.get(record.spec.job_id)
            decision = last.decision if last is not None else None
            jobs.append(
                (
                    JobSubmission(spec=record.spec, task=task["name"], steps=int(task["steps"])),
                    JobStatus(
                        spec=record.spec,
                        state="running" if record.state == "running" else "pending",
                        config=decision.config if decision is not None else None,
                        placement=decision.placement if decision is not None else None,
                        progress=record.progress,
                        started_s=record.sim_started_s,
                    ),
                )
            )
        self.backend.restore(jobs, taken_ids=repo.job_ids(session=session))
        # A running job resumes under its newest decision; if the daemon stopped between
        # committing and applying it, resuming is what applies it.
        repo.mark_decision_applied(
            session=session,
            decision_ids=[
                newest.decision.decision_id
                for submission, status in jobs
                if status.state == "running"
                and (newest := latest.get(submission.spec.job_id)) is not None
                and newest.applied_at is None
                and newest.decision.decision_id is not None
            ],
        )
        self._known = {submission.spec.job_id for submission, _ in jobs}
        for submission, status in jobs:
            event("job.resumed", job=submission.spec.job_id, state=status.state)
        return len(jobs)

    def _intake(self) -> None:
        """Hand the backend the jobs users submitted and the cancellations they asked
        for since the last tick."""
        if not isinstance(self.backend, JobControl):
            return
        with self.db.session() as session:
            new_ids = [
                job_id
                for job_id in repo.submitted_job_ids(session=session)
                if job_id not in self._known
            ]
            pending = [
                record
                for job_id in new_ids
                if (record := repo.get_job(session=session, job_id=job_id)) is not None
            ]
            cancels = repo.cancel_requests(session=session)
            for job_id in cancels:
                if job_id not in self._known:  # never reached the backend
                    repo.set_job_state(
                        session=session, job_id=job_id, state="cancelled", reason="cancelled"
                    )
                    self._job_rows.pop(job_id, None)
                    event("job.cancelled", job=job_id)
        for job_id in cancels:
            if job_id in self._known:
                self.backend.cancel(job_id)
                event("job.cancelled", job=job_id)
        for record in pending:
            job_id = record.spec.job_id
            task = record.task or {}
            if job_id in self._known or job_id in cancels or task.get("origin") != "api":
                continue
            try:
                self.backend.submit(
                    JobSubmission(spec=record.spec, task=task["name"], steps=int(task["steps"]))
                )
            except ValueError as exc:  # the backend cannot run it: say so on the job
                with self.db.session() as session:
                    repo.set_job_state(
                        session=session, job_id=job_id, state="failed", reason=str(exc)
                    )
                event("job.rejected", job=job_id, reason=str(exc))
                continue
            self._known.add(job_id)
            event("job.submitted", job=job_id, task=task["name"])

    def tick(self) -> TickReport:
        """One decision round. A failure is counted in ``health`` and raised."""
        try:
            report = self._tick()
        except Exception as exc:
            self._failed(exc)
            raise
        finally:  # even a failed tick may have committed part of its work
            for hook in self.after_tick:
                hook()
        self._succeeded(report)
        for observer in self.tick_observers:
            observer(report)
        return report

    def _failed(self, exc: Exception) -> None:
        before = self._health
        failures = before.consecutive_failures + 1
        fallback = before.fallback
        error = _error(exc)
        if fallback is None and self.fallback is not None and failures >= FALLBACK_AFTER:
            fallback = self.fallback.name
            event(
                "tick.fallback",
                level=logging.WARNING,
                failures=failures,
                error=error,
                policy=self.policy.version,
                fallback=self.fallback.version,
            )
        self._health = TickHealth(
            consecutive_failures=failures,
            failures_total=before.failures_total + 1,
            last_error=error,
            last_failure_at=utc_now(),
            fallback=fallback,
        )

    def _succeeded(self, report: TickReport) -> None:
        before = self._health
        if before.ok or report.fallback:
            return  # a tick the fallback decided leaves the loop degraded
        self._health = replace(before, consecutive_failures=0, fallback=None)
        event(
            "tick.recovered",
            failures=before.consecutive_failures,
            last_error=before.last_error,
            policy=self.policy.version,
            fallback_ended=before.fallback is not None,
        )

    def _decide(
        self, snapshot: ClusterSnapshot, overrides: dict[str, repo.OverrideRecord]
    ) -> tuple[DecisionRound, bool]:
        """The round's decisions, and whether the fallback policy took them: only when
        the daemon is on its fallback and its own policy fails this round too (the
        decision step is pure, so it can be taken again)."""

        def round_of(policy: Policy) -> DecisionRound:
            return decide(
                snapshot, policy, overrides, honoured=self._honoured, models=self._models_now
            )

        if self.fallback is None or self._health.fallback is None:
            return round_of(self.policy), False
        try:
            return round_of(self.policy), False
        except Exception as exc:
            error = _error(exc)
        self._health = health = replace(self._health, last_error=error, last_failure_at=utc_now())
        event(
            "policy.failed",
            level=logging.WARNING,
            policy=self.policy.version,
            error=error,
            fallback=self.fallback.version,
        )
        why = (
            f"{health.consecutive_failures} consecutive failed ticks ({error}); "
            f"deciding with {self.fallback.name}"
        )
        return round_of(_Fallback(self.fallback, why)), True

    def _provision(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Apply (or recommend) the provisioner's plan; the snapshot the tick decides on."""
        assert self.provisioner is not None
        plan = self.provisioner.plan(snapshot)
        park, wake = getattr(self.backend, "park", None), getattr(self.backend, "wake", None)
        applies = callable(park) and callable(wake) and hasattr(self.backend, "snapshot")
        last = self._provisioned
        if plan.park or plan.wake or (last is not None and (last.park or last.wake)):
            event(
                "provisioning",
                applied=applies,
                park=list(plan.park),
                wake=list(plan.wake),
                target_gpus=round(plan.target_gpus, 1),
                powered_gpus=plan.powered_gpus,
                reason=plan.reason,
            )
        self._provisioned = plan
        if not applies or not (plan.park or plan.wake):
            return snapshot
        park(plan.park)  # type: ignore[misc]
        wake(plan.wake)  # type: ignore[misc]
        fresh: ClusterSnapshot = self.backend.snapshot()  # type: ignore[attr-defined]
        return fresh

    def _tick(self) -> TickReport:
        started = time.perf_counter()
        if self.lifecycle is not None:
            self.lifecycle.before_tick(self)
        self._intake()
        snapshot = self.backend.observe()
        if self.provisioner is not None:
            snapshot = self._provision(snapshot)
        self._known.update(j.spec.job_id for j in snapshot.jobs)
        try:
            refitted = self.models.observe(snapshot)
            self._models_now = self.models.current()
        except Exception as exc:  # the fits are advice: a tick never fails on them
            event("performance.fit_failed", level=logging.WARNING, error=_error(exc))
            refitted, self._models_now = [], {}
        with self.db.session() as session:
            overrides = repo.active_overrides(session=session, at=utc_now())
        round_, used_fallback = self._decide(snapshot, overrides)
        if self.lifecycle is not None:
            self.lifecycle.after_decide(self, snapshot, overrides, round_)
        decisions, unplaced, why = round_.decisions, round_.unplaced, round_.why
        for job_id, reason in round_.skipped_overrides.items():
            event("override.skipped", job=job_id, reason=reason)
        with self.db.session() as session:  # committed before anything is applied
            if not self._reconciled:
                self._reconcile(session, snapshot)
                self._reconciled = True
            self._write_cluster(session, snapshot, unplaced)
            for job_id in refitted:
                summary = self.models.summary(job_id)
                if summary is not None:
                    repo.set_job_performance(session=session, job_id=job_id, performance=summary)
            stored = repo.create_decisions(
                session=session,
                decisions=[
                    (d, why[d.job_id].override_id, why[d.job_id].explanation) for d in decisions
                ],
            )
            if self.transitions is not None:
                self.transitions.record(
                    session,
                    policy=self.policy if not used_fallback else None,
                    backend=self.backend,
                    snapshot=snapshot,
                    round_=round_,
                    overrides=overrides,
                    stored=stored,
                )
        for decision in stored:
            self._honoured[decision.job_id] = why[decision.job_id].override_id
        self.backend.apply(stored)
        with self.db.session() as session:
            repo.mark_decision_applied(
                session=session, decision_ids=[d.decision_id for d in stored if d.decision_id]
            )
            for decision in stored:
                if decision.preempt:
                    repo.set_job_state(
                        session=session,
                        job_id=decision.job_id,
                        state="pending",
                        reason=decision.reason,
                    )
                else:
                    repo.set_job_state(session=session, job_id=decision.job_id, state="running")
                self._job_rows.pop(decision.job_id, None)
            duration = time.perf_counter() - started
            pending_ids = {j.spec.job_id for j in snapshot.by_state("pending")}
            started_now = sum(1 for d in stored if d.job_id in pending_ids)
            stopped_now = sum(1 for d in stored if d.preempt)
            running = len(snapshot.by_state("running")) + started_now - stopped_now
            pending = len(pending_ids) - started_now + stopped_now
            repo.record_metrics(
                session=session,
                values=[
                    ("tick_duration_s", duration, None),
                    ("jobs_running", float(running), None),
                    ("jobs_pending", float(pending), None),
                    ("gpu_utilization", snapshot.gpu_utilization, None),
                    ("gpu_demand", snapshot.demand_gpus(), None),
                    ("gpu_capacity", snapshot.capacity_gpus(), None),
                    *_provisioning_metrics(snapshot, self.provisioner, self._provisioned),
                    *_goodputs(snapshot),
                    *_measured(snapshot),
                ],
                labels={"backend": self.backend.name},
            )
        for decision in stored:
            event(
                "decision",
                job=decision.job_id,
                decision_id=decision.decision_id,
                source=decision.source,
                override_id=why[decision.job_id].override_id,
                placement="preempted"
                if decision.placement is None
                else placement_summary(decision.placement),
                reason=decision.reason,
            )
        for job_id, reason in unplaced.items():
            event("unplaced", level=logging.DEBUG, job=job_id, reason=reason)
        report = TickReport(
            time_s=snapshot.time_s,
            decisions=stored,
            unplaced=unplaced,
            duration_s=duration,
            running=running,
            pending=pending,
            gpu_utilization=snapshot.gpu_utilization,
            fallback=used_fallback,
        )
        return report

    def _reconcile(self, session: Session, snapshot: ClusterSnapshot) -> None:
        """At the first tick: a job the database holds as pending or running that the
        backend does not know (the daemon restarted, the simulated cluster started
        afresh) is marked failed, with the reason."""
        known = {j.spec.job_id for j in snapshot.jobs}
        for record in repo.active_jobs(session=session):
            if record.spec.job_id in known:
                continue
            submitted = record.submitted_at
            if submitted.tzinfo is None:
                submitted = submitted.replace(tzinfo=UTC)
            if submitted >= self._started_at:
                continue  # submitted through the API since start: the next intake takes it
            repo.set_job_state(
                session=session,
                job_id=record.spec.job_id,
                state="failed",
                reason=f"{record.state} when the daemon stopped; the {self.backend.name} "
                "backend no longer knows it",
            )
            event("job.lost", job=record.spec.job_id, was=record.state)

    def _write_cluster(
        self, session: Session, snapshot: ClusterSnapshot, unplaced: dict[str, str]
    ) -> None:
        nodes = (tuple(snapshot.nodes), tuple(snapshot.lost_nodes))
        if nodes != self._nodes_written:
            for name in repo.upsert_nodes(
                session=session, nodes=snapshot.nodes, lost=snapshot.lost_nodes
            ):
                event("node.lost", level=logging.WARNING, node=name)
            self._nodes_written = nodes
        for job in snapshot.jobs:
            reason = "cancelled on request" if job.state == "cancelled" else ""
            reason = unplaced.get(job.spec.job_id, reason)
            if job.interrupted:
                reason = f"{job.interrupted}; {reason}" if reason else job.interrupted
            self._write_job(session, job, reason)
        # Job rows before decision rows: without relationship() the unit of work does not
        # know the foreign key orders them.
        session.flush()

    def _write_job(self, session: Session, job: JobStatus, reason: str) -> None:
        progress = round(job.progress, 4)
        row = (job.state, reason, progress, job.spec.submitted_at, job.started_s, job.finished_s)
        if self._job_rows.get(job.spec.job_id) == row:
            return
        task: dict[str, Any] | None = None
        if job.task is not None and job.steps is not None:
            task = {"name": job.task, "steps": job.steps, "origin": self.backend.name}
            replay_info = getattr(self.backend, "replay_info", None)
            if replay_info is not None:  # stored once (upsert_job keeps the first)
                task["replay"] = replay_info(job.spec.job_id)
        repo.upsert_job(
            session=session,
            spec=job.spec,
            state=job.state,
            reason=reason,
            progress=progress,
            task=task,
            sim_submitted_s=job.spec.submitted_at,
            sim_started_s=job.started_s,
            sim_finished_s=job.finished_s,
        )
        self._job_rows[job.spec.job_id] = row

    def stop(self) -> None:
        """End the transition log's open episode (the round it logged last was never
        measured). Call once the decision loop has stopped."""
        if self.transitions is not None:
            with self.db.session() as session:
                self.transitions.close(session)

    def run(self, stop: threading.Event, tick_s: float) -> None:
        """Tick every ``tick_s`` seconds until ``stop`` is set; a tick in progress
        finishes first. A failing tick is logged with how many failed in a row, counted
        in ``health``, and the loop goes on (on the fallback policy after
        ``FALLBACK_AFTER`` of them).

        It runs in a thread of its own, not on the API's event loop, so a busy API
        cannot delay a tick's start; ticks start at a fixed rate (the wait is
        ``tick_s`` minus the tick's duration), and a tick longer than ``tick_s`` is
        followed by the next one at once."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                health = self._health
                logging.getLogger("autotune").exception(
                    "tick.failed",
                    extra={
                        "error": health.last_error,
                        "failures": health.consecutive_failures,
                        "fallback": health.fallback,
                    },
                )
            next_at = max(next_at + tick_s, time.monotonic())
            stop.wait(next_at - time.monotonic())


def _measured(snapshot: ClusterSnapshot) -> list[tuple[str, float, str | None]]:
    """What the backend measured on each running job's last step, as ``job_<name>``;
    not a backend's own ``goodput``: the daemon's (``_goodputs``) is the one stored."""
    return [
        (f"job_{name}", float(value), job.spec.job_id)
        for job in snapshot.by_state("running")
        for name, value in sorted(job.metrics.items())
        if name != "goodput"
    ]


def _goodputs(snapshot: ClusterSnapshot) -> list[tuple[str, float, str | None]]:
    """Each running job's goodput: measured samples/s times the statistical efficiency
    of its batch, compression and precision (``autotune.perf.model``)."""
    values: list[tuple[str, float, str | None]] = []
    for job in snapshot.by_state("running"):
        if job.config is None:
            continue
        efficiency = statistical_efficiency(job.spec.model, job.config, job.spec.global_batch)
        values.append(("job_goodput", job.samples_per_s * efficiency, job.spec.job_id))
    return values


def retention_loop(
    db: Database,
    policy: RetentionPolicy,
    every_s: float,
    stop: threading.Event,
    duty: float = 0.2,
) -> None:
    """Apply ``policy`` now and every ``every_s`` seconds until ``stop``: short
    transactions working ``duty`` of the time (``autotune.db.retention``), on ``db``'s
    own connection, so ticks and reads never wait more than one of them."""
    while not stop.is_set():
        try:
            report = run_retention(
                db, policy, utc_now(), pause_s=0.01, duty=duty, should_stop=stop.is_set
            )
        except Exception as exc:  # logged and retried at the next pass
            event("retention.failed", level=logging.WARNING, error=_error(exc))
        else:
            if report.rows_touched:
                event(
                    "retention",
                    deleted=report.deleted,
                    downsampled=report.metrics_downsampled,
                    written=report.metrics_written,
                    steps=report.steps,
                    seconds=round(report.elapsed_s, 2),
                    longest_step_s=round(report.max_step_s, 4),
                )
        stop.wait(every_s)


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: ``serve`` installs the daemon's
    for the whole stop, not only while requests are served."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(
    daemon: Daemon,
    *,
    host: str,
    port: int,
    tick_s: float,
    telemetry: str,
    api_db: Database | None = None,
    stop_timeout_s: float = 10.0,
    retention: RetentionPolicy | None = None,
    retention_every_s: float = 300.0,
    retention_duty: float = 0.2,
    **app_options: Any,
) -> None:
    """Run the decision loop and the API until SIGINT or SIGTERM; ``app_options`` go to
    ``autotune.api.app.create_app`` (token check, task allow-list, body limit, ...).

    ``api_db``: the API's own connections to the daemon's database (default: a second
    ``Database`` on the same URL), so readers never hold the connection a tick needs.
    ``retention``: applied every ``retention_every_s`` seconds in a thread of its own, on
    a third connection (``None``: history is kept forever).

    A signal stops everything within ``stop_timeout_s``: the API stops accepting and
    cuts requests still running after a third of it, the decision loop finishes its
    tick (a tick never applies what it has not committed), the backend checkpoints its
    running jobs with what is left. A second signal exits at once."""
    from autotune.api.app import attach_daemon, create_app

    api_db = api_db or Database(daemon.db.url)
    app = create_app(db=api_db, telemetry=telemetry, **app_options)
    attach_daemon(app, daemon)
    grace_s = stop_timeout_s / 3
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, round(grace_s)),
        )
    )
    stop = threading.Event()
    stopping_since: list[float] = []

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stopping_since:
            event("daemon.signal", level=logging.WARNING, signal=name, action="exit now")
            logging.shutdown()
            os._exit(128 + signum)
        stopping_since.append(time.monotonic())
        server.should_exit = True
        stop.set()
        event("daemon.signal", signal=name, action="stop", within_s=stop_timeout_s)

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def left() -> float:
        started = stopping_since[0] if stopping_since else time.monotonic()
        return max(0.0, started + stop_timeout_s - time.monotonic())

    # A daemon thread: a tick still running when the time is up does not hold the exit
    # (what it committed stays; what it did not commit never was).
    loop = threading.Thread(
        target=daemon.run, args=(stop, tick_s), name="decision-loop", daemon=True
    )

    housekeeping = None
    if retention is not None:
        retention_db = Database(daemon.db.url, pool_size=1)
        housekeeping = threading.Thread(
            target=retention_loop,
            args=(retention_db, retention, retention_every_s, stop, retention_duty),
            name="retention",
            daemon=True,
        )

    async def _main() -> None:
        loop.start()
        if housekeeping is not None:
            housekeeping.start()
        try:
            await server.serve()
        finally:
            stop.set()
            await asyncio.to_thread(loop.join, max(0.0, left() - stop_timeout_s / 3))
            if loop.is_alive():
                event("daemon.stop_tick_cut", level=logging.WARNING)

    daemon.start()
    # What start-up built (the policy, the app, the simulator) lives as long as the
    # process: out of the collector's sight, full collections stop scanning it, and the
    # API's latency loses their pauses.
    gc.collect()
    gc.freeze()
    event("api.listen", url=f"http://{host}:{port}/api/v1")
    try:
        # uvicorn's choice of event loop: uvloop where installed.
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            runner.run(_main())
    finally:
        try:
            if not loop.is_alive():  # a tick still running holds the log
                try:
                    daemon.stop()
                except Exception as exc:  # the backend's jobs are checkpointed regardless
                    event("daemon.stop_failed", level=logging.WARNING, error=_error(exc))
            daemon.backend.close(timeout_s=left())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            api_db.dispose()
            if housekeeping is not None:
                retention_db.dispose()
            daemon.db.dispose()
            event("daemon.stop")


def _provisioning_metrics(
    snapshot: ClusterSnapshot, provisioner: Provisioner | None, plan: ProvisioningPlan | None
) -> list[tuple[str, float, str | None]]:
    """Parked nodes now, and the provisioner's target (GPUs to keep powered)."""
    parked = float(len(snapshot.parked_nodes) + len(snapshot.waking_nodes))
    if provisioner is None or plan is None:
        return [("nodes_parked", parked, None)] if parked else []
    return [
        ("nodes_parked", parked, None),
        ("provisioning_target_gpus", plan.target_gpus, None),
        ("provisioning_recommended_park", float(len(plan.park)), None),
    ]
