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
   database that every decision a client read before the signal is still there.

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

from api_latency import free_port, percentile

OUT = Path(__file__).parent / "out"

MIX: dict[str, float] = {
    "decisions": 0.25,
    "decisions_cursor": 0.10,
    "decisions_job": 0.05,
    "jobs": 0.15,
    "cluster": 0.15,
    "healthz": 0.10,
    "decision": 0.12,
    "explain": 0.08,
}
"""Share of each kind of request in the load."""


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
        raise ValueError(kind)


IDLE_S = 4.0
"""Keep-alive connections idle this long are not reused (uvicorn closes them at 5 s), as
an HTTP client's pool does."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used_at = time.perf_counter()

    async def get(self, path: str) -> tuple[int, bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        match = re.search(rb"(?i)content-length:\s*(\d+)", head)
        body = await self.reader.readexactly(int(match.group(1))) if match else b""
        if re.search(rb"(?i)connection:\s*close", head):
            raise ConnectionResetError("server closes the connection")
        return status, body


class Load:
    """The open-loop client: a pool of keep-alive connections, grown on demand."""

    def __init__(self, port: int, targets: Targets, seed: int) -> None:
        self.port = port
        self.targets = targets
        self.idle: list[Connection] = []
        self.opened = 0
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.seen_ids: set[int] = set()
        self.kinds = list(MIX)
        self.weights = [MIX[k] for k in self.kinds]
        self.rng = random.Random(seed)
        self.signalled_at: float | None = None
        self.after_signal: dict[str, int] = defaultdict(int)

    async def _connection(self) -> Connection:
        while self.idle:
            connection = self.idle.pop()
            if time.perf_counter() - connection.used_at < IDLE_S:
                return connection
            connection.writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.opened += 1
        return Connection(reader, writer)

    async def one(self, kind: str, due: float) -> None:
        path = self.targets.path(kind)
        try:
            connection = await self._connection()
            status, body = await connection.get(path)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if self.signalled_at is not None:
                self.after_signal[type(exc).__name__] += 1
            else:
                self.status[kind][type(exc).__name__] += 1
            return
        connection.used_at = time.perf_counter()
        self.idle.append(connection)
        if self.signalled_at is not None and due >= self.signalled_at:
            self.after_signal[str(status)] += 1
            return
        self.latency[kind].append(time.perf_counter() - due)
        self.status[kind][str(status)] += 1
        if kind == "decisions" and status == 200:
            self.seen_ids.update(row["id"] for row in json.loads(body)["data"])

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
        for connection in self.idle:
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
    status, body = get(port, "/metrics")
    if status != 200:
        return None
    match = re.search(rb"^autotune_tick_failures_total (\S+)$", body, re.M)
    return int(float(match.group(1))) if match else None


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", help="SQLAlchemy URL of the database (default: build one)")
    parser.add_argument("--rate", type=float, default=200.0, help="Requests per second.")
    parser.add_argument("--seconds", type=float, default=60.0, help="Length of the load.")
    parser.add_argument("--tick-s", type=float, default=1.0, help="The daemon's tick.")
    parser.add_argument("--warmup", type=float, default=5.0, help="Seconds before the load.")
    parser.add_argument("--policy", default="rules", help="The daemon's policy (rules, ppo).")
    parser.add_argument("--pages", type=int, default=20, help="Repeats of each single page.")
    parser.add_argument("--sigterm", action="store_true", help="Stop the daemon under load.")
    parser.add_argument("--sigterm-after", type=float, default=None, help="Default: 80%% in.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path, default=OUT / "api_load.json")
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    tmp = Path(tempfile.mkdtemp(prefix="api-load-"))
    url = args.db
    if url is None:
        from history import build_history

        url = f"sqlite:///{tmp / 'history.db'}"
        build_history(url, days=0.5, cluster_gpus=64, progress=True)
    targets = Targets(url, args.seed)
    port = free_port()
    autotune = Path(sys.executable).parent / "autotune"
    env = {**os.environ, "AUTOTUNE_DATA_DIR": str(tmp), "AUTOTUNE_TOKEN": "bench"}
    log = (tmp / "daemon.log").open("wb")
    result_log = tmp / "daemon.log"
    started = time.monotonic()
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
            "text",
        ],
        cwd=tmp,
        env=env,
        stdout=log,
        stderr=log,
    )
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
        "daemon_log": str(result_log),
    }
    try:
        wait_up(port, daemon)
        result["startup_s"] = round(time.monotonic() - started, 1)
        time.sleep(args.warmup)
        result["single_pages"] = single_pages(port, targets, args.pages)
        load = Load(port, targets, args.seed)
        signal_after = args.sigterm_after if args.sigterm_after is not None else 0.8 * args.seconds
        stop: dict[str, float] = {}

        def wait_exit() -> None:
            try:
                daemon.wait(timeout=60)
                stop["exited"] = time.monotonic()
            except subprocess.TimeoutExpired:
                pass

        watcher = threading.Thread(target=wait_exit, daemon=True)

        def on_time(elapsed: float) -> None:
            if args.sigterm and "sent" not in stop and elapsed >= signal_after:
                stop["failed_ticks_before"] = float(failed_ticks(port) or 0)
                load.signalled_at = time.perf_counter()
                stop["sent"] = time.monotonic()
                stop["loaded_until"] = datetime.now(UTC).timestamp()
                daemon.send_signal(signal.SIGTERM)
                # The exit is timed by a thread of its own: the load goes on meanwhile.
                watcher.start()

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
            result["failed_ticks"] = failed_ticks(port)
        everything = [v for values in load.latency.values() for v in values]
        errors = {
            kind: {s: n for s, n in statuses.items() if s != "200"}
            for kind, statuses in load.status.items()
        }
        result.update(
            achieved_rate=round(achieved, 1),
            connections_opened=load.opened,
            latency=summary(everything),
            routes={kind: summary(values) for kind, values in sorted(load.latency.items())},
            errors={kind: e for kind, e in errors.items() if e},
            tick=tick_periods(url, load_start + timedelta(seconds=1), load_end),
            load_average_1m=round(os.getloadavg()[0], 2),
        )
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        log.close()
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
