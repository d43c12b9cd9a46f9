"""``build_history`` and the command line of ``bench/history.py``."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from autotune.benchmarks import OUT
from autotune.benchmarks.history.builder import History
from autotune.benchmarks.history.settings import (
    DEFAULT_CLUSTER_METRICS_EVERY,
    DEFAULT_DAYS,
    DEFAULT_DECISIONS_PER_DAY,
    DEFAULT_GPUS,
    DEFAULT_JOB_METRICS_EVERY,
    DEFAULT_TICK_S,
    cluster_nodes,
)
from autotune.benchmarks.history.templates import build_templates
from autotune.cli.common import progress_bar
from autotune.db import Database, sqlite_file, sqlite_url
from autotune.db import repository as repo
from autotune.db.retention import RetentionPolicy, RetentionReport, run_retention
from autotune.db.tables import (
    DecisionRow,
    JobRow,
    MetricRow,
    NodeRow,
    OverrideRow,
    PolicyVersionRow,
    TransitionRow,
)

# --- the build ------------------------------------------------------------------------


def _count(session: Session, table: Any) -> int:
    return int(session.scalar(select(func.count()).select_from(table)) or 0)


def build_history(
    url: str,
    *,
    days: float,
    cluster_gpus: int,
    tick_s: float,
    decisions_per_day: int,
    seed: int,
    end: datetime | None,
    progress: bool,
    job_metrics_every: int = DEFAULT_JOB_METRICS_EVERY,
    cluster_metrics_every: int = DEFAULT_CLUSTER_METRICS_EVERY,
    retention: RetentionPolicy | None = None,
    retention_every_s: float = 6 * 3600.0,
) -> dict[str, Any]:
    """Fill the database at ``url`` (migrated first; it must hold no job yet) with the
    history of ``days`` ending at ``end`` (default now); returns the summary.

    ``retention``: applied as the daemon's leader does, every ``retention_every_s`` of
    the history's time (at that time), so the database ends as a daemon that ran those
    days leaves it; the summary then has the database's size at the end of every day."""
    if days <= 0 or tick_s <= 0 or decisions_per_day <= 0:
        raise ValueError("days, tick_s and decisions_per_day must be > 0")
    if job_metrics_every < 1 or cluster_metrics_every < 1:
        raise ValueError("--job-metrics-every and --cluster-metrics-every: at least 1")
    began = time.perf_counter()
    if end is None:
        end = datetime.now(UTC).replace(microsecond=0)
    elif end.tzinfo is None:
        end = end.replace(tzinfo=UTC)
    end = end.astimezone(UTC)
    start = end - timedelta(days=days)
    nodes = cluster_nodes(cluster_gpus)
    templates = build_templates(random.Random(seed))
    db = Database(url)
    db.upgrade()
    try:
        with Session(db.engine, expire_on_commit=False) as session:
            if _count(session, JobRow):
                raise ValueError(f"{url}: the database already holds jobs; give a new one")
            history = History(
                session,
                nodes=nodes,
                templates=templates,
                start=start,
                days=days,
                tick_s=tick_s,
                decisions_per_day=decisions_per_day,
                seed=seed,
                job_metrics_every=job_metrics_every,
                cluster_metrics_every=cluster_metrics_every,
            )

            # Keep job rows alive while the job is: the repository's session.get then
            # finds them in the session instead of reading them back.
            @event.listens_for(session, "pending_to_persistent")
            def _keep(_session: Session, instance: object) -> None:
                if isinstance(instance, JobRow):
                    job = history.jobs.get(instance.job_id)
                    if job is not None:
                        job.row = instance

            # As the daemon's start: its fallback's version, then its own, active.
            repo.upsert_nodes(session=session, nodes=nodes, at=start)
            repo.register_policy_version(
                session=session, version=history.rules, kind="rules", at=start
            )
            repo.register_policy_version(
                session=session, version=history.ppo, kind="ppo", activate=True, at=start
            )
            session.commit()
            span = max(1, round(3_600 / tick_s))  # ticks of one transaction, about an hour
            retained = _Retained(db, retention, start, retention_every_s)
            with progress_bar("[bold]history[/] ticks", enabled=progress) as bar:
                task = bar.add_task("ticks", total=history.ticks)
                for k in range(history.ticks):
                    if k % span == 0:
                        history.pace(k * tick_s, span * tick_s)
                    history.tick(k)
                    if k % span == span - 1 or len(history.buffer) >= 5_000:
                        history.flush()
                        bar.update(task, completed=k + 1)
                        if k % span == span - 1:
                            retained.at(start + timedelta(seconds=(k + 1) * tick_s))
                history.flush()
                retained.at(end, last=True)
                bar.update(task, completed=history.ticks)
            summary = _summary(session, history)
            if retention is not None:
                summary["retention"] = retained.summary()
    finally:
        db.dispose()  # SQLite: the last connection folds the WAL into the file
    path = sqlite_file(url)
    size = None
    if path is not None:
        size = sum(
            p.stat().st_size for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()
        )
    seconds = time.perf_counter() - began
    rows = summary["rows"]
    return {
        "url": make_url(url).render_as_string(hide_password=True),
        "days": days,
        "cluster_gpus": cluster_gpus,
        "nodes": len(nodes),
        "tick_s": tick_s,
        "ticks": history.ticks,
        "decisions_per_day": decisions_per_day,
        "job_metrics_every": job_metrics_every,
        "cluster_metrics_every": cluster_metrics_every,
        "seed": seed,
        "start": start.isoformat(),
        "end": end.isoformat(),
        **summary,
        "file_bytes": size,
        "seconds": round(seconds, 1),
        "rows_per_s": round(sum(rows.values()) / seconds),
    }


class _Retained:
    """Retention applied during a build (``build_history(retention=...)``), and the
    database's size at the end of each day."""

    def __init__(
        self, db: Database, policy: RetentionPolicy | None, start: datetime, every_s: float
    ) -> None:
        self.db, self.policy, self.start, self.every_s = db, policy, start, every_s
        self.next_at = start + timedelta(seconds=every_s)
        self.next_day = 1
        self.sizes: list[int] = []
        self.report = RetentionReport()
        self.seconds = 0.0

    def at(self, now: datetime, *, last: bool = False) -> None:
        if self.policy is None:
            return
        if now >= self.next_at or last:
            began = time.perf_counter()
            self.report = self.report + run_retention(self.db, self.policy, now)
            self.seconds += time.perf_counter() - began
            self.next_at = now + timedelta(seconds=self.every_s)
        if now >= self.start + timedelta(days=self.next_day) or last:
            self.sizes.append(database_bytes(self.db))
            self.next_day += 1

    def summary(self) -> dict[str, Any]:
        return {
            "every_s": self.every_s,
            "policy": asdict(self.policy) if self.policy else None,
            "deleted": self.report.deleted,
            "metrics_downsampled": self.report.metrics_downsampled,
            "seconds": round(self.seconds, 1),
            "bytes_by_day": self.sizes,
        }


def database_bytes(db: Database) -> int:
    """The database's size on disk: SQLite's file with its WAL, or PostgreSQL's
    ``pg_database_size``."""
    path = sqlite_file(db.url)
    if path is None:
        with db.engine.connect() as connection:
            return int(
                connection.exec_driver_sql(
                    "SELECT pg_database_size(current_database())"
                ).scalar_one()
            )
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def _summary(session: Session, history: History) -> dict[str, Any]:
    tables = {
        "jobs": JobRow,
        "decisions": DecisionRow,
        "metrics": MetricRow,
        "overrides": OverrideRow,
        "transitions": TransitionRow,
        "nodes": NodeRow,
        "policy_versions": PolicyVersionRow,
    }
    rows = {name: _count(session, table) for name, table in tables.items()}
    by_source = dict(
        session.execute(select(DecisionRow.source, func.count()).group_by(DecisionRow.source)).all()
    )
    counters = history.counters
    return {
        "rows": rows,
        "decisions_by_source": {str(k): int(v) for k, v in sorted(by_source.items())},
        "jobs_by_state": repo.job_counts(session=session),
        "mean_gpu_utilization": round(counters.utilization_sum / max(1, counters.utilization_n), 3),
    }


def _default_retention() -> RetentionPolicy:
    """The retention the daemon applies at its default settings."""
    from autotune.daemon.settings import Settings

    return Settings.model_construct().retention()


def _when(text: str) -> datetime:
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Builds a new database: an existing --out file is refused unless --overwrite.",
    )
    parser.add_argument(
        "--db", help="SQLAlchemy URL of the database (default: the SQLite file --out)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT / "history.db",
        help="SQLite file to build when --db is not given (default: %(default)s)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--days", type=float, default=DEFAULT_DAYS, help="history length (default: %(default)s)"
    )
    parser.add_argument(
        "--cluster-gpus",
        type=int,
        default=DEFAULT_GPUS,
        help="GPUs of the cluster, in 8-GPU A100 nodes (default: %(default)s)",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=DEFAULT_TICK_S,
        help="the daemon's tick period, seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--decisions-per-day",
        type=int,
        default=DEFAULT_DECISIONS_PER_DAY,
        help="decisions the daemon takes per day (default: %(default)s)",
    )
    parser.add_argument(
        "--job-metrics-every",
        type=int,
        default=DEFAULT_JOB_METRICS_EVERY,
        help="ticks between two samples of every running job's metrics (default: "
        "%(default)s; the daemon records them every tick)",
    )
    parser.add_argument(
        "--cluster-metrics-every",
        type=int,
        default=DEFAULT_CLUSTER_METRICS_EVERY,
        help="ticks between two samples of the cluster's four metrics (default: "
        "%(default)s; 1: every tick, as the daemon)",
    )
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument(
        "--end",
        type=_when,
        default=None,
        help="ISO time the history ends (default: now, UTC; a time without zone is UTC)",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        default=OUT / "history.json",
        help="where the summary is written (default: %(default)s)",
    )
    parser.add_argument(
        "--retention",
        action="store_true",
        help="apply the daemon's default retention settings as the history is built (every "
        "6 hours of its time), as the daemon's leader would: the summary then gives the "
        "database's size at the end of each day",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    url = args.db
    if url is None:
        out: Path = args.out
        if out.exists():
            if not args.overwrite:
                parser.error(f"{out} exists: remove it, give another --out, or --overwrite")
            for suffix in ("", "-wal", "-shm"):
                Path(f"{out}{suffix}").unlink(missing_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        url = sqlite_url(out)
    summary = build_history(
        url,
        days=args.days,
        cluster_gpus=args.cluster_gpus,
        tick_s=args.tick_s,
        decisions_per_day=args.decisions_per_day,
        seed=args.seed,
        end=args.end,
        progress=not args.no_progress and sys.stderr.isatty(),
        job_metrics_every=args.job_metrics_every,
        cluster_metrics_every=args.cluster_metrics_every,
        retention=_default_retention() if args.retention else None,
    )
    text = json.dumps(summary, indent=2)
    print(text)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(text + "\n")


if __name__ == "__main__":
    main()
