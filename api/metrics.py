"""Prometheus metrics (``/metrics``): API latency and tick duration measured in the
process; failed ticks and the fallback read from the daemon's health at scrape time;
decisions per source, jobs per state and job goodput read from the database at scrape
time, so they survive restarts and count what is committed."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from autotune.api.cache import JobCounts
from autotune.daemon.health import TickHealth, TickReport
from autotune.daemon.leader import LeaderStatus
from autotune.db import Database
from autotune.db import repository as repo

__all__ = ["ServiceMetrics"]

# Loopback requests take about a millisecond; ticks tens of milliseconds to seconds.
_API_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _DatabaseCollector(Collector):
    def __init__(self, db: Database, job_counts: JobCounts, window: Callable[[], float]) -> None:
        self._db = db
        self._job_counts = job_counts
        self._window = window
        # Decisions per source: counted once, then only the rows above the highest id
        # counted (ids grow with commits: the decision loop is their one writer), so a
        # scrape costs the same on a month of history as on a minute. Retention deleting
        # old decisions does not lower it: it counts what was committed.
        self._lock = threading.Lock()
        self._by_source: Counter[str] = Counter()
        self._counted_to = 0

    def _decisions(self, session: Session) -> dict[str, int]:
        with self._lock:
            new, self._counted_to = repo.decision_counts(session=session, after_id=self._counted_to)
            self._by_source.update(new)
            return dict(self._by_source)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with self._db.session() as session:
            by_source = self._decisions(session)
            by_state = self._job_counts.read(session)
            goodput = repo.latest_metric_samples(
                session=session, name="job_goodput", within_s=self._window()
            )
        decisions = CounterMetricFamily(
            "autotune_decisions", "Decisions committed, per source", labels=["source"]
        )
        for source, count in sorted(by_source.items()):
            decisions.add_metric([source], count)
        yield decisions
        jobs = GaugeMetricFamily("autotune_jobs", "Jobs per state", labels=["state"])
        for state, count in by_state.items():
            jobs.add_metric([state], count)
        yield jobs
        family = GaugeMetricFamily(
            "autotune_job_goodput",
            "Goodput of each running job as last recorded (every job_metrics_every_s): samples/s "
            "times statistical efficiency",
            labels=["job"],
        )
        for sample in goodput:
            if sample.job_id is not None:
                family.add_metric([sample.job_id], sample.value)
        yield family


class _TickHealthCollector(Collector):
    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        if self._metrics.tick_health is None:
            return  # no decision loop in this process
        health = self._metrics.tick_health()
        failures = CounterMetricFamily(
            "autotune_tick_failures", "Decision rounds that failed since the daemon started"
        )
        failures.add_metric([], health.failures_total)
        yield failures
        in_a_row = GaugeMetricFamily(
            "autotune_tick_consecutive_failures", "Decision rounds failed in a row"
        )
        in_a_row.add_metric([], health.consecutive_failures)
        yield in_a_row
        fallback = GaugeMetricFamily(
            "autotune_tick_fallback",
            "1 while the daemon decides with its fallback policy (named by /readyz), else 0",
        )
        fallback.add_metric([], 1.0 if health.fallback is not None else 0.0)
        yield fallback
        paused = GaugeMetricFamily(
            "autotune_tick_paused",
            "1 while ticks are paused (the database cannot take them; /readyz says why), else 0",
        )
        paused.add_metric([], 1.0 if health.paused is not None else 0.0)
        yield paused
        status = self._metrics.leader_status() if self._metrics.leader_status else None
        if status is None:
            return
        leader = GaugeMetricFamily(
            "autotune_leader",
            "1 while this daemon holds the leader lease and decides, else 0 (it serves the "
            "API and takes over when the leader stops renewing)",
            labels=["daemon"],
        )
        leader.add_metric([status.daemon], 1.0 if status.leading else 0.0)
        yield leader
        if status.leader_term is not None:
            term = GaugeMetricFamily(
                "autotune_leader_term", "The leader lease's term as this daemon last read it"
            )
            term.add_metric([], status.leader_term)
            yield term


class ServiceMetrics:
    """One registry per app, so several apps (tests) never share counters."""

    def __init__(self, db: Database, job_counts: JobCounts | None = None) -> None:
        self.registry = CollectorRegistry()
        self.api_latency = Histogram(
            "autotune_api_request_duration_seconds",
            "API request latency, by method, route template and status",
            ["method", "route", "status"],
            buckets=_API_BUCKETS,
            registry=self.registry,
        )
        self.tick_duration = Histogram(
            "autotune_tick_duration_seconds",
            "Duration of a decision round (observe, decide, commit, apply)",
            buckets=_TICK_BUCKETS,
            registry=self.registry,
        )
        self.tick_health: Callable[[], TickHealth] | None = None
        """The daemon's health, where one runs in this process (``attach_daemon``)."""
        self.leader_status: Callable[[], LeaderStatus] | None = None
        """The daemon's leadership, where it shares the database with others."""
        self.job_metrics_every_s = 0.0
        """How often the daemon records every job's samples (``attach_daemon``): the
        goodput gauge shows each job's newest within that (plus a tick)."""
        self.registry.register(
            _DatabaseCollector(
                db, job_counts or JobCounts(), lambda: self.job_metrics_every_s + 5.0
            )
        )
        self.registry.register(_TickHealthCollector(self))

    def observe_tick(self, report: TickReport) -> None:
        self.tick_duration.observe(report.duration_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
