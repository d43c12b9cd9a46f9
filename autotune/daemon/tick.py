"""The daemon's decision loop: one tick at a time.

Every tick: hand the backend the jobs users submitted and cancelled, let a round of
simulated time pass on a backend that keeps it (``SimulatedTime``), observe the cluster,
ask the policy for its choices on the round's view (``autotune.decision.step.policy_view``),
take the round's decisions with the pure decision step (``autotune.decision.step.decide``:
the choices, the active overrides, the memory rule and the Planner), commit every decision
to the database, and only then apply it. A decision in the database with no
``applied_at`` was decided but not (yet) applied.

A failing tick is counted (``Daemon.health``: ``GET /readyz`` answers 503 naming it,
``/metrics`` counts it). After ``FALLBACK_AFTER`` failed ticks in a row the daemon
decides with its fallback policy (``DaemonParts.fallback``, the rules where the command
line assembles it) whenever its own policy fails: each tick still asks its own policy
first, and the first tick that its own policy decides and that completes ends the
fallback. Decisions the fallback takes have ``source="fallback"`` and say why
(``autotune.decision.fallback``).

A tick the database cannot take (unreachable, locked, full, read-only) is not a failure
of the policy: the loop pauses, says why (log event ``tick.paused``, ``/readyz``) and
resumes at the first tick the database takes; nothing is applied that was not committed.

Several daemons may run on one database (``autotune.daemon.leader``): each serves the
API, and only the one holding the leader lease ticks; every transaction that writes its
decisions first checks that it still holds the lease for its term (fencing).
``autotune.daemon.hosting`` runs this loop beside the API until a signal stops both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import UTC
from typing import Any

from sqlalchemy.orm import Session

from autotune.core import utc_now
from autotune.daemon.health import TickHealth, TickReport, database_unavailable, error_text
from autotune.daemon.log import event
from autotune.daemon.parts import DaemonParts, RoundInput
from autotune.daemon.performance import JobModels
from autotune.daemon.samples import (
    JobSampler,
    provisioning_samples,
)
from autotune.db import database_error
from autotune.db import repository as repo
from autotune.db.lease import LeaseLostError
from autotune.decision.fallback import fallback_choices
from autotune.decision.step import DecisionRound, decide, placement_summary, policy_view
from autotune.interfaces import (
    EVENTS_KEPT,
    ClusterSnapshot,
    Fenceable,
    JobControl,
    JobEvents,
    JobStatus,
    JobSubmission,
    Policy,
    PolicyRound,
    Provisionable,
    Replayable,
    SimulatedTime,
)
from autotune.perf.online import JobModel
from autotune.provisioning import ProvisioningPlan

__all__ = ["FALLBACK_AFTER", "Daemon", "DaemonParts", "RoundInput"]

FALLBACK_AFTER = 3
"""Failed ticks in a row after which the daemon decides with its fallback policy."""


class Daemon:
    """The decision loop of one daemon; see the module docstring."""

    def __init__(self, parts: DaemonParts) -> None:
        self.db = parts.db
        self.backend = parts.backend
        self.policy = parts.policy
        self.fallback = parts.fallback
        self.leadership = parts.leadership
        self.backend_factory = parts.backend_factory
        self.lifecycle = parts.lifecycle
        self.transitions = parts.transitions
        self.provisioner = parts.provisioner
        self.job_samples = JobSampler(parts.job_metrics_every_s)
        self._term: int | None = None
        """The leader term this daemon decides in; ``None`` without leadership or while
        it follows."""
        self._unmarked: list[int] = []
        """Decisions applied whose ``applied_at`` is not committed yet (the database
        failed right after the backend applied them): marked at the next tick."""
        self._events: list[tuple[str, dict[str, Any]]] = []
        """Job events taken from the backend and not yet stored (kept over a failed write,
        the newest ``EVENTS_KEPT``)."""
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
        self._declined: dict[str, str] = {}
        """Running jobs whose new configuration the last round declined, with the reason."""
        self._tick_observers: list[Callable[[TickReport], None]] = []
        self._after_tick: list[Callable[[], None]] = []
        self.models = JobModels()
        """Each running job's throughput model, fitted online from its measured steps."""
        self._models_now: dict[str, JobModel] = {}
        self._provisioned: ProvisioningPlan | None = None
        """The provisioner's newest plan."""
        self._registered = False
        """The policy was recorded in the registry with its checkpoint (``Lifecycle``)."""

    def add_tick_observer(self, observer: Callable[[TickReport], None]) -> None:
        """Call ``observer`` with the report of every tick that succeeds."""
        self._tick_observers.append(observer)

    def add_after_tick(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` after every tick, failed or not, once what it committed is
        visible."""
        self._after_tick.append(hook)

    @property
    def health(self) -> TickHealth:
        """How the decision loop is doing (safe to read from any thread)."""
        return self._health

    @property
    def term(self) -> int | None:
        """The leader term this daemon decides in (``None``: it follows, or decides
        without leadership)."""
        return self._term

    def start(self, *, activate: bool = True) -> None:
        """Record the policy version (and the fallback's), as the active one unless
        ``activate`` is false (a daemon taking over from another follows the registry's
        active version: ``Lifecycle.before_tick``); resume the database's active jobs on
        a backend that can (``JobControl``)."""
        self._started_at = utc_now()
        if self.lifecycle is not None and not self._registered:
            self.lifecycle.register(self.policy)
            self._registered = True
        with self._write_session() as session:
            if self.fallback is not None:
                repo.register_policy_version(
                    session=session, version=self.fallback.version, kind=self.fallback.name
                )
            repo.register_policy_version(
                session=session,
                version=self.policy.version,
                kind=self.policy.name,
                activate=activate or repo.active_policy_version(session=session) is None,
            )
            resumed = self._restore(session)
            if self.transitions is not None:
                # Rounds a stopped run logged but never measured end their episodes.
                self.transitions.close(session)
                repo.truncate_open_transitions(session=session)
        event(
            "daemon.start",
            backend=self.backend.name,
            policy=self.policy.version,
            resumed=resumed,
            term=self._term,
        )

    @contextmanager
    def _write_session(self) -> Iterator[Session]:
        """A transaction of the decision loop's writes: with leadership, it first checks
        that this daemon still leads in its term (``LeaseLostError`` otherwise, and nothing
        of it is committed)."""
        try:
            with self.db.session() as session:
                if self.leadership is not None and self._term is not None:
                    self.leadership.fence(session, self._term)
                yield session
        except BaseException:
            # Rolled back: what the rows were last written as is unknown again.
            self._job_rows.clear()
            self._nodes_written = None
            raise

    def take_over(self, term: int, *, activate: bool) -> None:
        """Start deciding as the leader of ``term``: resume the database's jobs on this
        daemon's backend (``start``)."""
        self._term = term
        if isinstance(self.backend, Fenceable):
            self.backend.lead(term)
        self.start(activate=activate)
        event("leader.took_over", term=term, backend=self.backend.name)

    def demote(self, reason: str, *, timeout_s: float = 30.0) -> None:
        """Stop deciding: another daemon leads now. The backend is closed (its running
        jobs checkpointed, so the leader resumes them) and, where there is a
        ``backend_factory``, a fresh one waits for this daemon's next term."""
        term, self._term = self._term, None
        event("leader.demoted", level=logging.WARNING, term=term, reason=reason)
        try:
            self.backend.close(timeout_s=timeout_s)
        except Exception as exc:  # what it could not checkpoint, the leader restarts
            event("daemon.backend_close_failed", level=logging.WARNING, error=error_text(exc))
        if self.backend_factory is not None:
            self.backend = self.backend_factory()
        self._known, self._honoured, self._job_rows = set(), {}, {}
        self._nodes_written, self._reconciled, self._unmarked = None, False, []
        self.models, self._models_now, self._provisioned = JobModels(), {}, None
        self.job_samples = JobSampler(self.job_samples.every_s)
        self._health = TickHealth()

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
        with self._write_session() as session:
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
        """One decision round. A failure is counted in ``health`` and raised; a tick the
        database could not take pauses the loop instead (``health.paused``)."""
        succeeded = False
        try:
            report = self._tick()
            succeeded = True
        except Exception as exc:
            if isinstance(exc, LeaseLostError):
                self._pause(error_text(exc))
            elif database_unavailable(exc):
                self._pause(f"the database cannot take the tick: {database_error(exc)}")
            else:
                self._failed(exc)
            raise
        finally:  # even a failed tick may have committed part of its work
            if self.lifecycle is not None:  # before the API's cache is cleared
                self.lifecycle.after_tick(succeeded=succeeded)
            for hook in self._after_tick:
                hook()
        self._succeeded(report)
        for observer in self._tick_observers:
            observer(report)
        return report

    def _failed(self, exc: Exception) -> None:
        before = self._health
        failures = before.consecutive_failures + 1
        fallback = before.fallback
        error = error_text(exc)
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

    def _pause(self, why: str) -> None:
        before = self._health
        if before.paused is None:
            event("tick.paused", level=logging.WARNING, reason=why, term=self._term)
        self._health = replace(before, paused=why, paused_since=before.paused_since or utc_now())

    def _succeeded(self, report: TickReport) -> None:
        before = self._health
        if before.paused is not None:
            assert before.paused_since is not None
            event(
                "tick.resumed",
                paused_s=round((utc_now() - before.paused_since).total_seconds(), 3),
                reason=before.paused,
            )
            self._health = before = replace(before, paused=None, paused_since=None)
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
        self, snapshot: ClusterSnapshot, overrides: Mapping[str, repo.OverrideRecord]
    ) -> tuple[PolicyRound, DecisionRound, bool]:
        """What the policy chose, the round's decisions, and whether the fallback policy
        took them: only when the daemon is on its fallback and its own policy fails this
        round too (the decision step is pure, so it can be taken again with the
        fallback's choices)."""
        view = policy_view(snapshot, overrides, self._honoured)

        def round_of(policy: Policy, answer: PolicyRound) -> DecisionRound:
            return decide(
                snapshot,
                answer.choices,
                overrides,
                honoured=self._honoured,
                policy_version=policy.version,
                models=self._models_now,
            )

        if self.fallback is None or self._health.fallback is None:
            answer = self.policy.decide(view)
            return answer, round_of(self.policy, answer), False
        try:
            answer = self.policy.decide(view)
            return answer, round_of(self.policy, answer), False
        except Exception as exc:
            error = error_text(exc)
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
        answer = PolicyRound(choices=fallback_choices(self.fallback, view, why))
        return answer, round_of(self.fallback, answer), True

    def _provision(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Apply (or recommend) the provisioner's plan; the snapshot the tick decides on."""
        assert self.provisioner is not None
        plan = self.provisioner.plan(snapshot)
        backend = self.backend
        applies = isinstance(backend, Provisionable)
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
        if not isinstance(backend, Provisionable) or not (plan.park or plan.wake):
            return snapshot
        backend.park(plan.park)
        backend.wake(plan.wake)
        return self.backend.observe()

    def _tick(self) -> TickReport:
        started = time.perf_counter()
        if self.lifecycle is not None:
            self.policy = self.lifecycle.before_tick(self.policy)
        self._intake()
        outcome = self.backend.run_round() if isinstance(self.backend, SimulatedTime) else None
        snapshot = self.backend.observe()
        if isinstance(self.backend, JobEvents):
            self._events.extend(self.backend.take_events())
            del self._events[:-EVENTS_KEPT]  # a long database outage: the newest
        if self.provisioner is not None:
            snapshot = self._provision(snapshot)
        self._known.update(j.spec.job_id for j in snapshot.jobs)
        try:
            refitted = self.models.observe(snapshot)
            self._models_now = self.models.current()
        except Exception as exc:  # the fits are advice: a tick never fails on them
            event("performance.fit_failed", level=logging.WARNING, error=error_text(exc))
            refitted, self._models_now = [], {}
        with self.db.session() as session:
            overrides = repo.active_overrides(session=session, at=utc_now())
            tenants = {t.spec.name: t.spec for t in repo.list_tenants(session=session)}
        if tenants:  # their quotas, for the decision step
            snapshot = replace(snapshot, tenants=tenants)
        answer, round_, used_fallback = self._decide(snapshot, overrides)
        if self.lifecycle is not None:
            self.lifecycle.after_decide(
                RoundInput(
                    snapshot=snapshot,
                    overrides=overrides,
                    honoured=dict(self._honoured),
                    models=self._models_now,
                ),
                answer,
                round_,
            )
        decisions, unplaced, why = round_.decisions, round_.unplaced, round_.why
        for job_id, reason in round_.skipped_overrides.items():
            event("override.skipped", job=job_id, reason=reason)
        for job_id, reason in round_.declined.items():
            if self._declined.get(job_id) != reason:  # once per reason, not every tick
                event("decision.declined", job=job_id, reason=reason)
        self._declined = dict(round_.declined)
        reconciling = not self._reconciled
        with self._write_session() as session:  # committed before anything is applied
            if reconciling:
                self._reconcile(session, snapshot)
            self._write_cluster(session, snapshot, unplaced)
            # A job's figures commit with its state: a reader who sees it finished
            # sees its last figures too (``apply`` below may take seconds on Ray).
            repo.record_metrics(
                session=session,
                values=self.job_samples.take(snapshot, started),
                labels={"backend": self.backend.name},
            )
            repo.record_job_events(session=session, events=self._events)
            for job_id in refitted:
                summary = self.models.summary(job_id)
                if summary is not None:
                    repo.set_job_performance(session=session, job_id=job_id, performance=summary)
            stored = repo.create_decisions(
                session=session,
                decisions=[
                    (d, why[d.job_id].override_id, why[d.job_id].explanation) for d in decisions
                ],
                term=self._term,
            )
            if self.transitions is not None:
                self.transitions.record(
                    session,
                    acted=None if used_fallback else answer.acted,
                    outcome=outcome,
                    snapshot=snapshot,
                    round_=round_,
                    overrides=overrides,
                    stored=stored,
                )
        self._reconciled = True
        self._events.clear()  # committed
        for decision in stored:
            self._honoured[decision.job_id] = why[decision.job_id].override_id
        self.backend.apply(stored)
        self._unmarked.extend(d.decision_id for d in stored if d.decision_id)
        with self._write_session() as session:
            repo.mark_decision_applied(session=session, decision_ids=self._unmarked)
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
                    *provisioning_samples(snapshot, self.provisioner, self._provisioned),
                ],
                labels={"backend": self.backend.name},
            )
        self._unmarked.clear()  # committed
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
        nodes = (
            tuple(snapshot.nodes),
            tuple(snapshot.lost_nodes),
            tuple(snapshot.parked_nodes),
            tuple(snapshot.waking_nodes),
        )
        if nodes != self._nodes_written:
            for name in repo.upsert_nodes(
                session=session,
                nodes=snapshot.nodes,
                lost=snapshot.lost_nodes,
                parked=snapshot.parked_nodes,
                waking=snapshot.waking_nodes,
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
            if isinstance(self.backend, Replayable):  # stored once (upsert_job keeps the first)
                task["replay"] = asdict(self.backend.replay_info(job.spec.job_id))
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
            if self.leadership is not None and not self._lead():
                stop.wait(min(tick_s, 0.2))  # following, or the lease is not renewed
                next_at = time.monotonic()
                continue
            try:
                self.tick()
            except LeaseLostError:
                assert self.leadership is not None
                assert self._term is not None
                self.leadership.lost(self._term)
            except Exception as exc:
                if not database_unavailable(exc):  # a pause is logged once, when it starts
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

    def _lead(self) -> bool:
        """Whether to tick now: this daemon leads, and has taken over if it just came to
        (demoted first if it lost the lease since its last tick)."""
        leadership = self.leadership
        assert leadership is not None
        if leadership.take_deposed() and self._term is not None:
            self.demote("another daemon took the leader lease")
        term = leadership.term
        if term is None or not leadership.leading:
            if self._term is not None:
                error = leadership.status().error or "no answer from the database"
                self._pause(
                    f"the leader lease was not renewed within {leadership.lease_s:g} s: {error}"
                )
            return False
        if term == self._term:
            return True
        if self._term is not None:
            self.demote(f"this daemon leads in term {term} now")
        try:
            self.take_over(term, activate=False)
        except Exception as exc:  # try again with a fresh backend at the next turn
            self.demote(f"taking over failed: {error_text(exc)}", timeout_s=5.0)
            self._pause(f"taking over in term {term} failed: {error_text(exc)}")
            return False
        return True
