"""Open-loop load on the daemon's API over a long history (`python bench/api_load.py`).

Starts ``autotune daemon`` (the built-in simulated cluster, ``--tick-s``) on the
database ``--db`` (any SQLAlchemy URL; without one, a small history is built first with
``bench/history.py``), then:

1. times single pages of decisions, one request at a time: the first page, one in the
   middle and the last (by cursor), and one job's decisions;
2. sends ``--rate`` requests per second for ``--seconds``, *open loop*: each request
   leaves at its scheduled time whether or not earlier ones were answered (a new
   keep-alive connection is opened when none is free), and its latency counts from that
   time, so a slow server cannot slow the client down and hide its own queueing. The mix
   (weights in ``MIX``): newest decisions, decisions by cursor (middle and last pages),
   one job's decisions, ``/jobs``, ``/cluster``, ``/healthz``, ``/decisions/{id}`` and
   ``/decisions/{id}/explain``;
3. with ``--sigterm``, sends the daemon SIGTERM ``--sigterm-after`` seconds into the
   load (the load goes on) and measures how long it takes to exit, then checks in the
   database that every decision a client read before the signal is still there;
4. with ``--failover``, starts a second daemon on the same database (it follows: it
   serves the API and waits for the leader lease), spreads the load over both, SIGKILLs
   the leader ``--kill-after`` seconds in, and measures how long until the follower leads
   and decides; then checks in the database that no decision of the old term came after
   the new term's first (one leader at a time), how many were left unapplied, and that
   every decision a client read is still there;
5. with ``--db-outage S`` (PostgreSQL started by the benchmark: ``--postgres``), stops the
   database server for ``S`` seconds ``--outage-after`` seconds in, then starts it again:
   counts answers by status during and after (503 is the only 5xx allowed), the longest
   request, the time from the server's return until ``/readyz`` is ready and a new tick
   is committed, and checks that nothing committed before the outage was lost.

``--postgres`` runs a throwaway PostgreSQL server from the installed binaries (as the
tests do) and builds the history into it when ``--db`` is not given.

Reports per route p50/p99/max latency, errors by status, the achieved rate, the tick
period while loaded (from the ``tick_duration_s`` samples the daemon commits each tick)
and failed ticks (``/metrics``). Prints one JSON object and writes it to
``bench/out/api_load.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT, REPO
from autotune.benchmarks.api_latency import free_port, percentile

MIX: dict[str, float] = {
    "decisions": 0.24,
    "decisions_cursor": 0.09,
    "decisions_job": 0.05,
    "jobs": 0.13,
    "job": 0.05,
    "cluster": 0.13,
    "healthz": 0.07,
    "metrics": 0.03,
    "decision": 0.10,
    "explain": 0.07,
    "post_job": 0.015,
    "post_override": 0.01,
    "delete_override": 0.005,
}
"""Share of each kind of request in the load: reads, and a few writes (a job submitted,
an override set on a job and one of them deleted)."""
WRITES = ("post_job", "post_override", "delete_override")
TOKEN = "bench"


class Targets:
    """What the requests ask for, read from the database before the daemon starts:
    decision ids, cursors into the middle and the end, job ids with decisions."""

    def __init__(self, url: str, seed: int) -> None:
        from sqlalchemy import func, select

        from autotune.db import Database
        from autotune.db.repository import encode_cursor
        from autotune.db.tables import DecisionRow

        database = Database(url)
        with database.session() as session:
            low, high = session.execute(
                select(func.min(DecisionRow.id), func.max(DecisionRow.id))
            ).one()
            if low is None:
                raise SystemExit(f"no decisions in {url}: build a history first")
            self.low, self.high = int(low), int(high)
            rng = random.Random(seed)
            probes = [rng.randint(self.low, self.high) for _ in range(200)]
            self.job_ids = sorted(
                set(session.scalars(select(DecisionRow.job_id).where(DecisionRow.id.in_(probes))))
            )
            self.count = int(session.scalar(select(func.count(DecisionRow.id))) or 0)
        database.dispose()
        self.overrides: list[int] = []
        """Overrides the load created (``delete_override`` deletes one of them)."""
        self.submitted = 0
        self.middle = encode_cursor((self.low + self.high) // 2)
        self.last = encode_cursor(self.low + 26)
        self.rng = random.Random(seed + 1)

    def path(self, kind: str) -> str:
        rng = self.rng
        if kind == "decisions":
            return "/api/v1/decisions?limit=50"
        if kind == "decisions_cursor":
            return f"/api/v1/decisions?limit=50&cursor={rng.choice([self.middle, self.last])}"
        if kind == "decisions_job":
            return f"/api/v1/decisions?limit=50&job={rng.choice(self.job_ids)}"
        if kind == "jobs":
            return "/api/v1/jobs?limit=50"
        if kind == "cluster":
            return "/api/v1/cluster"
        if kind == "healthz":
            return "/healthz"
        if kind == "decision":
            return f"/api/v1/decisions/{rng.randint(self.low, self.high)}"
        if kind == "explain":
            return f"/api/v1/decisions/{rng.randint(self.low, self.high)}/explain"
        if kind == "job":
            return f"/api/v1/jobs/{rng.choice(self.job_ids)}"
        if kind == "metrics":
            return "/metrics"
        if kind == "post_job":
            return "/api/v1/jobs"
        if kind == "post_override":
            return "/api/v1/overrides"
        if kind == "delete_override":
            return f"/api/v1/overrides/{self.overrides.pop() if self.overrides else 1}"
        raise ValueError(kind)

    def request(self, kind: str) -> tuple[str, str, bytes | None]:
        """``(method, path, JSON body)`` of one request of ``kind``."""
        path = self.path(kind)
        if kind == "post_job":
            self.submitted += 1
            body = {"task": "gpt-char", "steps": 2000, "job_id": f"load-{self.submitted}"}
            return "POST", path, json.dumps(body).encode()
        if kind == "post_override":
            body = {
                # a job the load submitted: it waits or runs (the history's have ended)
                "job_id": f"load-{self.rng.randint(1, self.submitted)}"
                if self.submitted
                else self.rng.choice(self.job_ids),
                "compression": {"kind": "none"},
                "ttl_s": 120,
                "reason": "api_load",
            }
            return "POST", path, json.dumps(body).encode()
        if kind == "delete_override":
            return "DELETE", path, None
        return "GET", path, None


IDLE_S = 4.0
"""Keep-alive connections idle this long are not reused (uvicorn closes them at 5 s), as
an HTTP client's pool does."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used_at = time.perf_counter()

    async def send(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if method != "GET":
            head += f"Authorization: Bearer {TOKEN}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        await self.writer.drain()
        answer = await self.reader.readuntil(b"\r\n\r\n")
        status = int(answer.split(b" ", 2)[1])
        match = re.search(rb"(?i)content-length:\s*(\d+)", answer)
        body = await self.reader.readexactly(int(match.group(1))) if match else b""
        if re.search(rb"(?i)connection:\s*close", answer):
            raise ConnectionResetError("server closes the connection")
        return status, body


class Load:
    """The open-loop client: a pool of keep-alive connections per daemon, grown on demand;
    requests go to the daemons (``ports``; on ``hosts[port]``, 127.0.0.1 by default) in
    turn, of the kinds of ``mix`` (``MIX`` by default) in its shares."""

    def __init__(
        self,
        ports: list[int],
        targets: Targets,
        seed: int,
        *,
        hosts: dict[int, str] | None = None,
        mix: dict[str, float] | None = None,
    ) -> None:
        self.ports = ports
        self.hosts = dict(hosts or {})
        self.targets = targets
        self.idle: dict[int, list[Connection]] = {port: [] for port in ports}
        self.sent = 0
        self.opened = 0
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.seen_ids: set[int] = set()
        mix = MIX if mix is None else mix
        self.kinds = list(mix)
        self.weights = [mix[k] for k in self.kinds]
        self.rng = random.Random(seed)
        self.signalled_at: float | None = None
        self.after_signal: dict[str, int] = defaultdict(int)
        self.killed: int | None = None
        """The port of the daemon that was killed (its answers are counted apart)."""
        self.killed_port: dict[str, int] = defaultdict(int)
        self.window: tuple[float, float] | None = None
        """``(start, end)`` perf_counter times of an outage: answers due inside it are
        counted apart in ``during`` (and their latencies in ``during_latency``)."""
        self.during: dict[str, int] = defaultdict(int)
        self.during_latency: list[float] = []
        self.slowest_s = 0.0

    async def _connection(self, port: int) -> Connection:
        idle = self.idle[port]
        while idle:
            connection = idle.pop()
            if time.perf_counter() - connection.used_at < IDLE_S:
                return connection
            connection.writer.close()
        reader, writer = await asyncio.open_connection(self.hosts.get(port, "127.0.0.1"), port)
        self.opened += 1
        return Connection(reader, writer)

    async def one(self, kind: str, due: float) -> None:
        port = self.ports[self.sent % len(self.ports)]
        self.sent += 1
        method, path, body_out = self.targets.request(kind)
        try:
            connection = await asyncio.wait_for(self._connection(port), timeout=30)
            status, body = await asyncio.wait_for(
                connection.send(method, path, body_out), timeout=30
            )
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
            outcome = type(exc).__name__
            if port == self.killed:
                self.killed_port[outcome] += 1
            elif self.signalled_at is not None:
                self.after_signal[outcome] += 1
            elif self.window is not None and due >= self.window[0]:
                self.during[outcome] += 1
            else:
                self.status[kind][outcome] += 1
            return
        connection.used_at = time.perf_counter()
        self.idle[port].append(connection)
        elapsed = time.perf_counter() - due
        self.slowest_s = max(self.slowest_s, elapsed)
        if port == self.killed:
            self.killed_port[str(status)] += 1
            return
        if self.signalled_at is not None and due >= self.signalled_at:
            self.after_signal[str(status)] += 1
            return
        if self.window is not None and self.window[0] <= due <= self.window[1] + 5:
            self.during[str(status)] += 1
            self.during_latency.append(elapsed)
            if status == 503 and b"detail" not in body:
                self.during["503 without a reason"] += 1
            return
        self.latency[kind].append(elapsed)
        self.status[kind][str(status)] += 1
        if kind == "decisions" and status == 200:
            self.seen_ids.update(row["id"] for row in json.loads(body)["data"])
        if kind == "post_override" and status == 201:
            self.targets.overrides.append(int(json.loads(body)["id"]))

    async def run(self, rate: float, seconds: float, on_time: Any = None) -> float:
        """Requests at ``rate`` per second for ``seconds``; ``on_time(elapsed)`` is called
        on every send (for the signal). Returns the achieved send rate."""
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        total = int(rate * seconds)
        for i in range(total):
            due = start + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if on_time is not None:
                on_time(time.perf_counter() - start)
            kind = self.rng.choices(self.kinds, self.weights)[0]
            task = asyncio.create_task(self.one(kind, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        sent_in = time.perf_counter() - start
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        for idle in self.idle.values():
            for connection in idle:
                connection.writer.close()
        return total / sent_in


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "n": len(values),
        "p50_ms": round(1000 * percentile(values, 50), 1),
        "p99_ms": round(1000 * percentile(values, 99), 1),
        "max_ms": round(1000 * max(values), 1),
    }


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_up(port: int, daemon: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited with {daemon.returncode} before serving")
        try:
            if get(port, "/healthz", timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the daemon did not answer /healthz in time")


def single_pages(port: int, targets: Targets, repeat: int) -> dict[str, Any]:
    """One request at a time: the first page, a middle one and the last (by cursor), and
    a job's decisions. Each request asks a page size not asked before (50, 49, ...), so
    none is answered from the daemon's per-tick cache: these are database reads."""
    paths = {
        "first": "/api/v1/decisions?limit={n}",
        "middle": f"/api/v1/decisions?limit={{n}}&cursor={targets.middle}",
        "last": f"/api/v1/decisions?limit={{n}}&cursor={targets.last}",
        "job": f"/api/v1/decisions?limit={{n}}&job={targets.job_ids[0]}",
    }
    out: dict[str, Any] = {}
    for name, template in paths.items():
        times = []
        for i in range(repeat):
            path = template.format(n=50 - i % 40)
            started = time.perf_counter()
            status, _ = get(port, path)
            times.append(time.perf_counter() - started)
            if status != 200:
                raise SystemExit(f"{path}: {status}")
        out[name] = {
            "median_ms": round(1000 * percentile(times, 50), 1),
            "max_ms": round(1000 * max(times), 1),
        }
    return out


def tick_periods(url: str, since: datetime, until: datetime) -> dict[str, Any]:
    """Tick period (time between committed ticks) and duration in [since, until]."""
    from autotune.db import Database
    from autotune.db import repository as repo

    database = Database(url)
    with database.session() as session:
        samples = repo.list_metrics(
            session=session, names=["tick_duration_s"], since=since, limit=100_000
        )
    database.dispose()
    inside = [s for s in samples if s.recorded_at <= until]
    times = [s.recorded_at.timestamp() for s in inside]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if not gaps:
        return {"ticks": len(inside)}
    return {
        "ticks": len(inside),
        "period_p50_s": round(percentile(gaps, 50), 3),
        "period_p99_s": round(percentile(gaps, 99), 3),
        "period_max_s": round(max(gaps), 3),
        "duration_p99_s": round(percentile([s.value for s in inside], 99), 3),
    }


def failed_ticks(port: int) -> int | None:
    """The daemon's failed ticks (``None``: it did not answer within 30 s)."""
    try:
        status, body = get(port, "/metrics", timeout=30)
    except OSError:
        return None
    if status != 200:
        return None
    match = re.search(rb"^autotune_tick_failures_total (\S+)$", body, re.M)
    return int(float(match.group(1))) if match else None


def decision_ids(url: str) -> set[int]:
    """Every decision id the database holds."""
    from sqlalchemy import select

    from autotune.db import Database
    from autotune.db.tables import DecisionRow

    database = Database(url)
    try:
        with database.session() as session:
            return set(session.scalars(select(DecisionRow.id)))
    finally:
        database.dispose()


def missing_decisions(url: str, ids: set[int]) -> int:
    """How many of ``ids`` the database no longer holds."""
    from sqlalchemy import select

    from autotune.db import Database
    from autotune.db.tables import DecisionRow

    database = Database(url)
    with database.session() as session:
        found = 0
        ordered = sorted(ids)
        for i in range(0, len(ordered), 500):
            chunk = ordered[i : i + 500]
            found += len(
                list(session.scalars(select(DecisionRow.id).where(DecisionRow.id.in_(chunk))))
            )
    database.dispose()
    return len(ids) - found


def start_daemon(
    url: str, port: int, data_dir: Path, args: argparse.Namespace, name: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """``autotune daemon`` on ``url``; its log in ``data_dir / <name>.log``."""
    autotune = Path(sys.executable).parent / "autotune"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AUTOTUNE_DATA_DIR": str(data_dir), "AUTOTUNE_TOKEN": TOKEN}
    log_path = data_dir / f"{name}.log"
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            [
                str(autotune),
                "daemon",
                "--db",
                url,
                "--port",
                str(port),
                "--tick-s",
                str(args.tick_s),
                "--policy",
                args.policy,
                "--log-level",
                "INFO",
                "--log-format",
                "json",
            ],
            cwd=data_dir,
            env=env,
            stdout=log,
            stderr=log,
        )
    return daemon, log_path


def vacuum_analyze(url: str) -> None:
    """What autovacuum does to a database that has run a while: statistics for the
    planner and the visibility map that index-only scans need (a history written a
    moment ago has neither, and its pages read several times slower)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("VACUUM ANALYZE"))
    engine.dispose()


def readiness(port: int) -> dict[str, Any] | None:
    try:
        status, body = get(port, "/api/v1/readyz", timeout=2)
    except OSError:
        return None
    return json.loads(body) if status in (200, 503) else None


def lease_history(url: str) -> list[dict[str, Any]]:
    """Every leader term with its decisions: ``autotune.db.lease.terms``."""
    from autotune.db import Database
    from autotune.db import lease as leases

    database = Database(url)
    with database.session() as session:
        rows = leases.terms(session)
    database.dispose()
    return [
        {"term": t, "holder": h, "decisions": n, "first_id": lo, "last_id": hi}
        for t, h, n, lo, hi in rows
    ]


def unapplied(url: str) -> int:
    from sqlalchemy import func, select

    from autotune.db import Database
    from autotune.db.tables import DecisionRow

    database = Database(url)
    with database.session() as session:
        count = session.scalar(
            select(func.count()).select_from(DecisionRow).where(DecisionRow.applied_at.is_(None))
        )
    database.dispose()
    return int(count or 0)


def newest_tick(url: str) -> datetime | None:
    """When the newest committed tick was recorded (its ``tick_duration_s`` sample)."""
    from sqlalchemy import func, select

    from autotune.db import Database
    from autotune.db.tables import MetricRow

    database = Database(url)
    try:
        with database.session() as session:
            newest: datetime | None = session.scalar(
                select(func.max(MetricRow.recorded_at)).where(MetricRow.name == "tick_duration_s")
            )
    finally:
        database.dispose()
    return newest


class Watch(threading.Thread):
    """Polls ``check()`` every 0.1 s from ``start()`` until it returns true: ``seconds``
    is how long that took (``None``: not within ``timeout_s``)."""

    def __init__(self, check: Any, timeout_s: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.check, self.timeout_s = check, timeout_s
        self.seconds: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        while time.monotonic() - started < self.timeout_s:
            try:
                if self.check():
                    self.seconds = time.monotonic() - started
                    return
            except Exception:  # the database or the daemon is not back yet
                pass
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", help="SQLAlchemy URL of the database (default: build one)")
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="Run a throwaway PostgreSQL server (the installed binaries) for the history.",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="Requests per second.")
    parser.add_argument("--seconds", type=float, default=60.0, help="Length of the load.")
    parser.add_argument("--tick-s", type=float, default=1.0, help="The daemon's tick.")
    parser.add_argument("--warmup", type=float, default=5.0, help="Seconds before the load.")
    parser.add_argument("--policy", default="rules", help="The daemon's policy (rules, ppo).")
    parser.add_argument("--pages", type=int, default=20, help="Repeats of each single page.")
    parser.add_argument("--sigterm", action="store_true", help="Stop the daemon under load.")
    parser.add_argument("--sigterm-after", type=float, default=None, help="Default: 80%% in.")
    parser.add_argument(
        "--failover", action="store_true", help="Two daemons; SIGKILL the leader under load."
    )
    parser.add_argument("--kill-after", type=float, default=None, help="Default: 40%% in.")
    parser.add_argument(
        "--db-outage",
        type=float,
        default=None,
        metavar="S",
        help="Stop the PostgreSQL server (--postgres) for S seconds under load.",
    )
    parser.add_argument("--outage-after", type=float, default=None, help="Default: 25%% in.")
    parser.add_argument("--history-days", type=float, default=0.5, help="Without --db.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path, default=OUT / "api_load.json")
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    if sum([args.sigterm, args.failover, args.db_outage is not None]) > 1:
        parser.error("--sigterm, --failover and --db-outage: one at a time")
    if args.db_outage is not None and not args.postgres:
        parser.error("--db-outage stops the benchmark's own server: add --postgres")
    tmp = Path(tempfile.mkdtemp(prefix="api-load-"))
    server = None
    if args.postgres:
        sys.path.insert(0, str(REPO / "tests"))
        from helpers import PostgresServer  # type: ignore[import-not-found]

        server = PostgresServer()
    try:
        run(args, tmp, server)
    finally:
        if server is not None:
            server.close()


def run(args: argparse.Namespace, tmp: Path, server: Any) -> None:
    url = args.db
    if url is None:
        from autotune.benchmarks.history import DEFAULT_DECISIONS_PER_DAY, build_history

        url = server.create_database() if server is not None else f"sqlite:///{tmp / 'h.db'}"
        build_history(
            url,
            days=args.history_days,
            cluster_gpus=64,
            tick_s=2.0,
            decisions_per_day=DEFAULT_DECISIONS_PER_DAY,
            seed=args.seed,
            end=None,
            progress=True,
        )
        if server is not None:
            vacuum_analyze(url)
    targets = Targets(url, args.seed)
    port = free_port()
    started = time.monotonic()
    daemon, result_log = start_daemon(url, port, tmp / "a", args, "daemon")
    daemons = [daemon]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).date().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}",
        "database": url.split("://")[0],
        "decisions_in_db": targets.count,
        "rate": args.rate,
        "seconds": args.seconds,
        "tick_s": args.tick_s,
        "policy": args.policy,
        "mix": MIX,
        "daemon_log": str(result_log),
    }
    try:
        wait_up(port, daemon)
        result["startup_s"] = round(time.monotonic() - started, 1)
        ports = [port]
        if args.failover:
            port_b = free_port()
            follower, log_b = start_daemon(url, port_b, tmp / "b", args, "follower")
            daemons.append(follower)
            wait_up(port_b, follower)
            result["follower_log"] = str(log_b)
            ports.append(port_b)
            ready = readiness(port_b) or {}
            if (ready.get("leader") or {}).get("leading"):
                raise SystemExit("the second daemon leads: the first should")
        time.sleep(args.warmup)
        result["single_pages"] = single_pages(port, targets, args.pages)
        load = Load(ports, targets, args.seed)
        signal_after = args.sigterm_after if args.sigterm_after is not None else 0.8 * args.seconds
        kill_after = args.kill_after if args.kill_after is not None else 0.4 * args.seconds
        outage_after = args.outage_after if args.outage_after is not None else 0.25 * args.seconds
        stop: dict[str, Any] = {}

        def wait_exit() -> None:
            try:
                daemon.wait(timeout=60)
                stop["exited"] = time.monotonic()
            except subprocess.TimeoutExpired:
                pass

        watcher = threading.Thread(target=wait_exit, daemon=True)
        leads = Watch(lambda: ((readiness(ports[-1]) or {}).get("leader") or {}).get("leading"))

        def new_term_decided() -> bool:
            history = lease_history(url)
            return len(history) >= 2 and history[-1]["decisions"] > 0

        decides = Watch(new_term_decided)

        def outage() -> None:
            load.window = (time.perf_counter(), time.perf_counter() + args.db_outage)
            before = newest_tick(url)
            server.stop("fast")
            time.sleep(args.db_outage)
            server.start()
            stop["back"] = time.monotonic()
            ready = Watch(lambda: (readiness(port) or {}).get("status") == "ready", 60)
            ticked = Watch(lambda: (newest_tick(url) or before) > before, 60)  # type: ignore[operator]
            ready.start()
            ticked.start()
            ready.join()
            ticked.join()
            stop["ready_after_s"], stop["tick_after_s"] = ready.seconds, ticked.seconds

        outage_thread = threading.Thread(target=outage, daemon=True)

        def on_time(elapsed: float) -> None:
            if args.sigterm and "sent" not in stop and elapsed >= signal_after:
                stop["failed_ticks_before"] = float(failed_ticks(port) or 0)
                load.signalled_at = time.perf_counter()
                stop["sent"] = time.monotonic()
                stop["loaded_until"] = datetime.now(UTC).timestamp()
                daemon.send_signal(signal.SIGTERM)
                # The exit is timed by a thread of its own: the load goes on meanwhile.
                watcher.start()
            if args.failover and "killed" not in stop and elapsed >= kill_after:
                load.killed = port
                daemon.kill()
                stop["killed"] = time.monotonic()
                leads.start()
                decides.start()
            if args.db_outage is not None and "outage" not in stop and elapsed >= outage_after:
                stop["outage"] = time.monotonic()
                outage_thread.start()

        load_start = datetime.now(UTC)
        achieved = asyncio.run(load.run(args.rate, args.seconds, on_time))
        load_end = datetime.now(UTC)
        if args.sigterm:
            watcher.join(timeout=60)
            exit_s = stop["exited"] - stop["sent"] if "exited" in stop else float("inf")
            result["sigterm"] = {
                "after_s": signal_after,
                "exit_s": round(exit_s, 2),
                "exit_code": daemon.returncode,
                "requests_after_signal": dict(load.after_signal),
                "decisions_read_before": len(load.seen_ids),
                "decisions_lost": missing_decisions(url, load.seen_ids),
                "failed_ticks": int(stop["failed_ticks_before"]),
            }
            load_end = datetime.fromtimestamp(stop["loaded_until"], UTC)
        else:
            result["failed_ticks"] = failed_ticks(ports[-1])
        if args.failover:
            leads.join(timeout=120)
            decides.join(timeout=120)
            history = lease_history(url)
            old, new = history[-2], history[-1]
            result["failover"] = {
                "kill_after_s": kill_after,
                "leads_after_s": None if leads.seconds is None else round(leads.seconds, 2),
                "decides_after_s": None if decides.seconds is None else round(decides.seconds, 2),
                "terms": history,
                "one_leader_at_a_time": old["last_id"] is None
                or new["first_id"] is None
                or old["last_id"] < new["first_id"],
                "decisions_unapplied": unapplied(url),
                "decisions_read": len(load.seen_ids),
                "decisions_lost": missing_decisions(url, load.seen_ids),
                "killed_daemon_answers": dict(load.killed_port),
            }
        if args.db_outage is not None:
            outage_thread.join(timeout=120)
            result["db_outage"] = {
                "after_s": outage_after,
                "seconds": args.db_outage,
                "answers_during": dict(load.during),
                "server_errors_other_than_503": sum(
                    n
                    for s, n in load.during.items()
                    if s.isdigit() and int(s) >= 500 and s != "503"
                ),
                "slowest_answer_during_s": round(max(load.during_latency, default=0.0), 3),
                "ready_after_return_s": stop.get("ready_after_s"),
                "tick_after_return_s": stop.get("tick_after_s"),
                "decisions_read": len(load.seen_ids),
                "decisions_lost": missing_decisions(url, load.seen_ids),
                "daemon_alive": daemon.poll() is None,
            }
        everything = [
            v for kind, values in load.latency.items() if kind not in WRITES for v in values
        ]
        errors = {
            kind: {s: n for s, n in statuses.items() if not s.isdigit() or int(s) >= 500}
            for kind, statuses in load.status.items()
        }
        result.update(
            achieved_rate=round(achieved, 1),
            connections_opened=load.opened,
            latency=summary(everything),
            routes={kind: summary(values) for kind, values in sorted(load.latency.items())},
            statuses={kind: dict(statuses) for kind, statuses in sorted(load.status.items())},
            errors={kind: e for kind, e in errors.items() if e},
            slowest_answer_s=round(load.slowest_s, 3),
            tick=tick_periods(url, load_start + timedelta(seconds=1), load_end),
            load_average_1m=round(os.getloadavg()[0], 2),
        )
    finally:
        for process in daemons:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
