"""``History``: the month played tick by tick, every row written through the repository."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import update
from sqlalchemy.orm import Session

from autotune import __version__
from autotune.benchmarks.history.cluster import Cluster, Counters, Job
from autotune.benchmarks.history.settings import (
    BACKEND,
    CANCELLED,
    DECISIONS_PER_JOB,
    DURATION_SIGMA,
    FAIL_REASONS,
    FALLBACK_ERRORS,
    FATES,
    GPU_WEIGHTS,
    OFFERED_LOAD,
    OVERRIDE_DELETED,
    OVERRIDE_SHARE,
    PINS,
    RESTART_S,
    SLOTS,
    TRANSITION_SHARE,
)
from autotune.benchmarks.history.templates import Template, Templates, with_override
from autotune.core import (
    Decision,
    DecisionSource,
    JobSpec,
    NodeInfo,
    Placement,
    RankSlot,
)
from autotune.daemon.tick import FALLBACK_AFTER
from autotune.db import repository as repo
from autotune.db.tables import (
    DecisionRow,
    JobRow,
)
from autotune.decision.step import placement_summary
from autotune.envs.workloads import STREAM_MIX, job_stream
from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import HEADER, SLOT


class History:
    """The daemon's history, tick by tick, written as it goes."""

    def __init__(
        self,
        session: Session,
        *,
        nodes: list[NodeInfo],
        templates: Templates,
        start: datetime,
        days: float,
        tick_s: float,
        decisions_per_day: int,
        seed: int,
        job_metrics_every: int,
        cluster_metrics_every: int,
    ) -> None:
        self.session = session
        self.templates = templates
        self.start = start
        self.tick_s = tick_s
        self.ticks = max(1, math.floor(days * 86_400 / tick_s))
        self.horizon_s = (self.ticks - 1) * tick_s
        """The last tick, before the history's end."""
        self.decisions_per_day = decisions_per_day
        self.job_metrics_every = job_metrics_every
        self.cluster_metrics_every = cluster_metrics_every
        self.rng = random.Random(seed)
        self.cluster = Cluster(nodes)
        self.ppo = f"ppo-{__version__}"
        self.transition_step = 0
        self.rules = f"rules-{__version__}"
        self.slots: dict[tuple[int, int, int], RankSlot] = {}
        self.jobs: dict[str, Job] = {}
        self.queue: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.events: list[tuple[float, int, str, str, int]] = []
        self.sequence = 0
        self.buffer: list[tuple[Decision, int | None, dict[str, Any] | None]] = []
        self.counters = Counters()
        self.dirty = False
        jobs_per_day = decisions_per_day / DECISIONS_PER_JOB
        self.arrivals = self._arrivals(np.random.default_rng(seed), jobs_per_day)
        self.next_arrival = next(self.arrivals, None)
        # Durations for OFFERED_LOAD: arrivals/s x mean GPUs x mean duration = busy GPUs.
        mean_gpus = sum(
            share * self._mean_wish(name, lo, hi) for name, share, lo, hi in STREAM_MIX
        ) / sum(share for _, share, _, _ in STREAM_MIX)
        mean_s = OFFERED_LOAD * self.cluster.total / (jobs_per_day / 86_400 * mean_gpus)
        self.median_s = mean_s / math.exp(DURATION_SIGMA**2 / 2)
        self.resize_rate = 0.0
        self.next_resize_s = math.inf
        self.episodes = self._episodes(days)

    # -- set-up -----------------------------------------------------------------------

    def _mean_wish(self, model: str, lo: int, hi: int) -> float:
        options = self.templates.options(model, lo, hi) or [lo]
        weights = [GPU_WEIGHTS.get(g, 1.0) for g in options]
        return sum(g * w for g, w in zip(options, weights, strict=True)) / sum(weights)

    def _arrivals(self, rng: np.random.Generator, jobs_per_day: float) -> Iterator[Any]:
        for arrival in job_stream(
            rng, mean_interarrival_s=86_400 / jobs_per_day, initial_jobs=0, max_jobs=None
        ):
            if arrival.spec.submitted_at > self.horizon_s:
                return
            yield arrival

    def _episodes(self, days: float) -> list[tuple[float, float, str]]:
        """Fallback episodes: (start, end, error), about one in four days."""
        count = max(1, round(days / 4))
        episodes = []
        for _ in range(count):
            begin = self.rng.uniform(0.05, 0.95) * self.horizon_s
            length = self.rng.uniform(60, 900)
            episodes.append((begin, begin + length, self.rng.choice(FALLBACK_ERRORS)))
        return sorted(episodes)

    def _fallback(self, now_s: float) -> tuple[str, float] | None:
        """The episode under way at ``now_s``: its error and start, or ``None``."""
        for begin, end, error in self.episodes:
            if begin <= now_s < end:
                return error, begin
        return None

    def _push(self, at_s: float, kind: str, job: Job) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at_s, self.sequence, kind, job.job_id, job.generation))

    def at(self, seconds: float, after_s: float = 0.0) -> datetime:
        """The time ``seconds`` into the history, plus ``after_s`` within that tick."""
        return self.start + timedelta(seconds=seconds + min(after_s, 0.9 * self.tick_s))

    # -- decisions --------------------------------------------------------------------

    def _placement(self, job: Job) -> Placement:
        slots = []
        for rank, (node, gpu) in enumerate(job.gpus):
            slot = self.slots.get((rank, node, gpu))
            if slot is None:
                slot = self.slots[rank, node, gpu] = RankSlot(
                    rank=rank, node_id=self.cluster.names[node], gpu_index=gpu
                )
            slots.append(slot)
        return Placement(job_id=job.job_id, ranks=tuple(slots))

    def _decide(
        self,
        job: Job,
        template: Template,
        now_s: float,
        *,
        source: DecisionSource = "policy",
        version: str | None = None,
        core: str | None = None,
        override_id: int | None = None,
    ) -> None:
        """Record a decision for ``job`` on its GPUs from ``template``."""
        placement = self._placement(job)
        core = template.core if core is None else core
        features = dict(template.explanation.get("features", {}))
        live = {
            "gpu_utilization": self.cluster.held / self.cluster.total,
            "jobs_pending": float(len(self.queue)),
            "jobs_running": float(len(self.running)),
            "free_gpus": float(self.cluster.total - self.cluster.held),
            "waiting_jobs": float(len(self.queue)),
            "forecast": self.cluster.held / self.cluster.total,
        }
        features.update({k: round(v, 6) for k, v in live.items() if k in features})
        explanation = {**template.explanation, "features": features, "why": core + template.suffix}
        self.counters.in_tick += 1
        decided = self.at(now_s, 0.003 + 0.000_05 * self.counters.in_tick)
        decision = Decision(
            job_id=job.job_id,
            config=template.config,
            placement=placement,
            source=source,
            policy_version=version or self.ppo,
            reason=f"{core}; placed on {placement_summary(placement)}",
            decided_at=decided,
        )
        self.buffer.append((decision, override_id, explanation))
        self.counters.decisions += 1
        # Work done so far at the old speed; then the restart, then the new speed.
        if job.template is not None and job.state == "running":
            job.work -= job.template.goodput * max(0.0, now_s - job.since_s)
            restart = RESTART_S
        else:
            restart = 0.0
        job.template = template
        job.since_s = now_s + restart
        job.generation += 1
        finish = job.since_s + max(0.0, job.work) / template.goodput
        self._push(finish, "finish", job)
        if source == "policy" and self.rng.random() < TRANSITION_SHARE:
            self._transition(job, template, decided)

    def _transition(self, job: Job, template: Template, at: datetime) -> None:
        # A logged round as the daemon's transition log writes it: the observation's
        # header and occupied slots, compressed, and each acted slot's entries.
        slots = min(32, max(1, len(self.queue) + len(self.running)))
        used = HEADER + len(SLOT) * slots
        observation = np.zeros(used, dtype=np.float32)
        observation[:HEADER] = round(self.cluster.held / self.cluster.total, 4)
        observation[HEADER:] = np.round(
            np.array([self.rng.random() for _ in range(used - HEADER)]), 3
        )
        entries = [[self.rng.randrange(n) for n in ACTION_DIMS] for _ in range(slots)]
        self.transition_step += 1
        repo.create_transition(
            session=self.session,
            episode="history-0000",
            step=self.transition_step,
            policy_version=self.ppo,
            epsilon=0.05,
            observation=repo.pack_observation(observation, used),
            slots={
                "jobs": [job.job_id] * slots,
                "running": [True] * slots,
                "entries": entries,
                "mask": [[1] * len(ACTION_DIMS)] * slots,
                "logp": [[-0.05] * len(ACTION_DIMS)] * slots,
                "applied": [True] * slots,
            },
            at=at,
        )

    def _fallback_core(self, template: Template, error: str, began_s: float, now_s: float) -> str:
        # The daemon's wording (autotune.daemon.tick's fallback): failed ticks, the error.
        failed = FALLBACK_AFTER + int((now_s - began_s) / self.tick_s)
        why = f"{failed} consecutive failed ticks ({error}); deciding with rules"
        return f"{why}: {template.core}"

    def _start_queued(self, now_s: float, new: set[str]) -> None:
        """Place the first ``SLOTS`` queued jobs that fit, each on its wish or less."""
        fallback = self._fallback(now_s)
        started: list[Job] = []
        for position, job in enumerate(self.queue.values()):
            if position >= SLOTS or self.cluster.held >= self.cluster.total:
                break
            for gpus in sorted((g for g in job.options if g <= job.wish), reverse=True):
                taken = self.cluster.take(gpus)
                if taken is not None:
                    job.gpus = taken
                    break
            else:
                continue
            key = (job.model, len(job.gpus))
            if fallback is None:
                self._decide(job, self.rng.choice(self.templates.chosen[key]), now_s)
            else:
                template = self.templates.rules[key]
                core = self._fallback_core(template, fallback[0], fallback[1], now_s)
                self._decide(job, template, now_s, source="fallback", version=self.rules, core=core)
            started.append(job)
        for job in started:
            del self.queue[job.job_id]
            self.running[job.job_id] = job
            job.state = "running"
            if job.job_id not in new:  # else its row is written as running (in tick)
                when = self.at(now_s, 0.02)
                self._hold(job)
                repo.set_job_state(
                    session=self.session, job_id=job.job_id, state="running", at=when
                )
                repo.upsert_job(
                    session=self.session,
                    spec=job.spec,
                    state="running",
                    task=job.task,
                    sim_started_s=now_s,
                    at=when,
                )
            if job.fate == "failed":
                self._push(now_s + self.rng.uniform(0.05, 0.95) * self._expected(job), "fail", job)
            if self.rng.random() < OVERRIDE_SHARE and (job.model, len(job.gpus)) in (
                self.templates.override
            ):
                self._push(now_s + self.rng.uniform(0.1, 0.6) * self._expected(job), "pin", job)

    def _expected(self, job: Job) -> float:
        assert job.template is not None
        return job.work / job.template.goodput

    def _hold(self, job: Job) -> None:
        if job.row is None:
            job.row = self.session.get(JobRow, job.job_id)

    def _resize(self, now_s: float) -> None:
        """The learned policy reconfigures a running job: other GPUs, or the same ones."""
        candidates = [j for j in self.running.values() if j.override_id is None]
        if not candidates:
            return
        job = self.rng.choice(candidates)
        gpus = len(job.gpus)
        index = job.options.index(gpus)
        choices = job.options[max(0, index - 1) : index + 2]
        target = self.rng.choice(choices)
        if target < gpus:
            keep, give = job.gpus[:target], job.gpus[target:]
            self.cluster.give(give)
            job.gpus = keep
            self.dirty = True
        elif target > gpus:
            grown = self.cluster.grow(job.gpus, target)
            if grown is None:
                moved = self.cluster.take(target)
                if moved is None:
                    target = gpus  # no room: the same GPUs, another configuration
                else:
                    self.cluster.give(job.gpus)
                    grown = moved
            if grown is not None:
                job.gpus = grown
        template = self.rng.choice(self.templates.reconfigured[job.model, target])
        self.counters.resizes += 1
        self._decide(job, template, now_s)

    # -- events -----------------------------------------------------------------------

    def _arrive(self, arrival: Any, now_s: float, new: set[str]) -> None:
        spec: JobSpec = arrival.spec
        model = str(arrival.task)
        options = self.templates.options(model, spec.min_gpus, spec.max_gpus)
        if not options:
            return
        weights = [GPU_WEIGHTS.get(g, 1.0) for g in options]
        wish = self.rng.choices(options, weights)[0]
        duration = max(10 * self.tick_s, self.median_s * self.rng.lognormvariate(0, DURATION_SIGMA))
        reference = self.templates.rules[model, wish].goodput
        steps = max(1, round(duration * reference / spec.global_batch))
        fate = self.rng.choices([f for f, _ in FATES], [w for _, w in FATES])[0]
        job = Job(
            spec=spec,
            model=model,
            task={"name": model, "steps": steps, "origin": BACKEND},
            fate=fate,
            wish=wish,
            options=options,
            work=float(steps * spec.global_batch),
            total_work=float(steps * spec.global_batch),
        )
        self.jobs[job.job_id] = job
        self.queue[job.job_id] = job
        new.add(job.job_id)
        self.dirty = True
        if fate == "cancelled":
            self._push(spec.submitted_at + self.rng.expovariate(1 / duration), "cancel", job)

    def _end(self, job: Job, state: str, reason: str, now_s: float) -> None:
        """The job reaches a final state."""
        progress = 1.0 if state == "finished" else round(job.progress_at(now_s), 4)
        if job.state == "running":
            self.cluster.give(job.gpus)
            del self.running[job.job_id]
        else:
            del self.queue[job.job_id]
        self.dirty = True
        job.state = state
        job.gpus = []
        repo.upsert_job(
            session=self.session,
            spec=job.spec,
            state=state,  # type: ignore[arg-type]
            reason=reason,
            progress=progress,
            task=job.task,
            sim_submitted_s=job.spec.submitted_at,
            sim_finished_s=now_s,
            at=self.at(now_s, 0.01),
        )
        job.row = None
        del self.jobs[job.job_id]

    def _pin(self, job: Job, now_s: float) -> None:
        """A user pins part of the running job's configuration; the daemon applies it."""
        index, template = self.rng.choice(self.templates.override[job.model, len(job.gpus)])
        pin, reason = PINS[index]
        created = self.at(now_s - self.rng.uniform(0, self.tick_s))
        lasts = self.rng.uniform(1_800, 12 * 3_600)
        record = repo.create_override(
            session=self.session,
            job_id=job.job_id,
            pin=pin,
            reason=reason,
            expires_at=created + timedelta(seconds=lasts),
            at=created,
        )
        ends = now_s + lasts
        if self.rng.random() < OVERRIDE_DELETED:
            ends = now_s + self.rng.uniform(0.1, 0.7) * lasts
            self._push(ends, "unpin", job)
        job.override_id = record.override_id
        self._push(ends + self.tick_s, "released", job)
        fallback = self._fallback(now_s)
        core = with_override(template.core, record.override_id)
        version = self.rules if fallback is not None else self.ppo
        self._decide(
            job,
            template,
            now_s,
            source="override",
            version=version,
            core=core,
            override_id=record.override_id,
        )

    def _unpin(self, job: Job, now_s: float) -> None:
        if job.override_id is not None:
            repo.delete_override(
                session=self.session,
                override_id=job.override_id,
                at=self.at(now_s - self.rng.uniform(0, self.tick_s)),
            )

    def _released(self, job: Job, now_s: float) -> None:
        """The job's override ended: the policy decides for it again."""
        if job.override_id is None:
            return
        ended, job.override_id = job.override_id, None
        fallback = self._fallback(now_s)
        key = (job.model, len(job.gpus))
        if fallback is None:
            template = self.rng.choice(self.templates.released[key])
            core = with_override(template.core, ended)
            self._decide(job, template, now_s, core=core)
        else:
            template = self.templates.rules[key]
            # decide()'s wording for a released job, with the fallback's reason.
            choice = self._fallback_core(template, fallback[0], fallback[1], now_s)
            core = f"override {ended} ended; the policy decides again: {choice}"
            self._decide(job, template, now_s, source="fallback", version=self.rules, core=core)

    def _event(self, kind: str, job: Job, generation: int, now_s: float) -> None:
        if job.state not in ("pending", "running"):
            return
        if kind == "finish" and job.state == "running" and generation == job.generation:
            self._end(job, "finished", "", now_s)  # done before it failed or was cancelled
        elif kind == "fail" and job.state == "running":
            self._end(job, "failed", self.rng.choice(FAIL_REASONS), now_s)
        elif kind == "cancel":
            self._end(job, "cancelled", CANCELLED, now_s)
        elif kind == "pin" and job.state == "running" and job.override_id is None:
            self._pin(job, now_s)
        elif kind == "unpin":
            self._unpin(job, now_s)
        elif kind == "released" and job.state == "running":
            self._released(job, now_s)

    # -- the ticks --------------------------------------------------------------------

    def tick(self, k: int) -> None:
        now_s = k * self.tick_s
        self.counters.in_tick = 0
        new: set[str] = set()
        while self.next_arrival is not None and self.next_arrival.spec.submitted_at <= now_s:
            self._arrive(self.next_arrival, now_s, new)
            self.next_arrival = next(self.arrivals, None)
        while self.events and self.events[0][0] <= now_s:
            _, _, kind, job_id, generation = heapq.heappop(self.events)
            job = self.jobs.get(job_id)
            if job is not None:
                self._event(kind, job, generation, now_s)
        if self.dirty and self.queue:
            self._start_queued(now_s, new)
        self.dirty = False
        while self.next_resize_s <= now_s:
            # In a fallback episode the rules decide: they keep running jobs' configurations.
            if self._fallback(now_s) is None:
                self._resize(now_s)
            self.next_resize_s += self.rng.expovariate(self.resize_rate)
        # The new jobs' rows, as pending or (placed in this tick) running; not flushed
        # one by one when upsert_job looks each up: together, with the next statement.
        with self.session.no_autoflush if new else nullcontext():
            for job_id in new:
                job = self.jobs.get(job_id)
                if job is None:
                    continue  # cancelled on arrival: its row is written
                running = job.state == "running"
                repo.upsert_job(
                    session=self.session,
                    spec=job.spec,
                    state="running" if running else "pending",
                    task=job.task,
                    sim_submitted_s=job.spec.submitted_at,
                    sim_started_s=now_s if running else None,
                    at=self.at(now_s),
                )
        if k == self.ticks - 1:  # the last tick: what is still active is cancelled
            for job in [*self.running.values(), *self.queue.values()]:
                self._end(job, "cancelled", CANCELLED, now_s)
        self._metrics(k, now_s)

    def pace(self, now_s: float, span_s: float) -> None:
        """Set the resize rate for the next ``span_s`` so that the decisions meet
        ``decisions_per_day`` at its end, with as many other decisions (starts,
        overrides) as in the span before."""
        counters = self.counters
        others = counters.decisions - counters.resizes
        expected, counters.others_before = others - counters.others_before, others
        target = self.decisions_per_day * (now_s + span_s) / 86_400
        missing = target - counters.decisions - expected
        self.resize_rate = max(missing, 0.0) / span_s
        self.next_resize_s = (
            now_s + self.rng.expovariate(self.resize_rate) if self.resize_rate > 0 else math.inf
        )

    def _metrics(self, k: int, now_s: float) -> None:
        cluster = k % self.cluster_metrics_every == 0
        jobs = k % self.job_metrics_every == 0
        if not (cluster or jobs):
            return
        utilization = self.cluster.held / self.cluster.total
        self.counters.utilization_sum += utilization
        self.counters.utilization_n += 1
        active = len(self.running) + len(self.queue)
        duration = (0.004 + 0.0002 * active) * self.rng.lognormvariate(0, 0.3)
        values: list[tuple[str, float, str | None]] = [
            ("tick_duration_s", round(duration, 6), None),
            ("jobs_running", float(len(self.running)), None),
            ("jobs_pending", float(len(self.queue)), None),
            ("gpu_utilization", utilization, None),
        ]
        if jobs:
            for job in self.running.values():
                template = job.template
                assert template is not None
                up = now_s >= job.since_s
                noise = self.rng.uniform(0.95, 1.05)
                if self.rng.random() < 0.002:
                    job.nan_events += 1
                values += [
                    ("job_goodput", template.goodput * noise if up else 0.0, job.job_id),
                    ("job_nan_events", float(job.nan_events), job.job_id),
                    ("job_power_watts", template.power_watts * noise, job.job_id),
                    ("job_step_time_s", template.step_s / noise, job.job_id),
                ]
        repo.record_metrics(
            session=self.session,
            values=values,
            labels={"backend": BACKEND},
            at=self.at(now_s, duration),
        )

    def flush(self) -> None:
        """Store the buffered decisions (one statement), mark them applied, commit."""
        self.session.flush()  # job and override rows before the decisions that name them
        stored = repo.create_decisions(session=self.session, decisions=self.buffer)
        ids = [d.decision_id for d in stored if d.decision_id is not None]
        if ids:
            # A fix-up, not a repository call: the daemon marks each decision applied
            # right after applying it (repo.mark_decision_applied loads each row: a
            # million reads here); one UPDATE gives them their decision's time.
            self.session.execute(
                update(DecisionRow)
                .where(DecisionRow.id.between(min(ids), max(ids)))
                .values(applied_at=DecisionRow.decided_at)
            )
        self.buffer = []
        self.session.commit()
