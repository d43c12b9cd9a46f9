"""API latency under load while the daemon ticks (`python bench/api_latency.py`).

Fills a temporary SQLite database with ``--prefill-ticks`` ticks of the decision loop
(in process, the built-in simulated cluster), starts ``autotune daemon`` on it (it
resumes the jobs) on a free loopback port, then runs ``--clients``
concurrent clients (one keep-alive connection each, asyncio, one process) that each
``GET /api/v1/decisions`` back to back for ``--seconds``. Reports request latency
(p50/p90/p99/max), throughput and errors, and the daemon's tick period (time between
the per-tick samples it commits) in the same window before the load (idle) and under
it, and the policy version the daemon decides with (its default ``ppo``: the learned
policy, or ``ppo-fallback-rules-...`` when the checkpoint does not fit the current
spaces). Prints one JSON object and writes it to ``bench/out/api_latency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.benchmarks import OUT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def client(
    port: int, path: str, deadline: float, latencies: list[float], errors: list[str]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    try:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(str(status))
    finally:
        writer.close()


async def load(port: int, path: str, clients: int, seconds: float) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds
    results = await asyncio.gather(
        *(client(port, path, deadline, latencies, errors) for _ in range(clients)),
        return_exceptions=True,
    )
    errors += [repr(r) for r in results if isinstance(r, BaseException)]
    return latencies, errors


def tick_samples(db: Path, start: float, end: float) -> tuple[list[float], list[float]]:
    """Commit times (epoch s) and durations (s) of the ticks committed in [start, end]."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT recorded_at, value FROM metrics WHERE name = 'tick_duration_s' ORDER BY id"
        ).fetchall()
    samples = [(datetime.fromisoformat(r[0]).replace(tzinfo=UTC).timestamp(), r[1]) for r in rows]
    inside = [(t, v) for t, v in samples if start <= t <= end]
    return [t for t, _ in inside], [v for _, v in inside]


def periods(times: list[float], durations: list[float]) -> dict[str, float]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if not gaps:
        return {}
    return {
        "ticks": len(times),
        "period_mean_s": round(statistics.fmean(gaps), 3),
        "period_p50_s": round(percentile(gaps, 50), 3),
        "period_p99_s": round(percentile(gaps, 99), 3),
        "period_max_s": round(max(gaps), 3),
        "tick_duration_mean_s": round(statistics.fmean(durations), 3),
        "tick_duration_max_s": round(max(durations), 3),
    }


def prefill(db: Path, ticks: int, seed: int, *, round_s: float, mean_interarrival_s: float) -> None:
    """A decision log to page through: ``ticks`` ticks of the loop, in process."""
    from autotune.daemon.tick import Daemon, DaemonParts
    from autotune.db import Database, sqlite_url
    from autotune.envs.simulator import SimConfig, SimulatedCluster
    from autotune.policies.rules import RulesPolicy

    database = Database(sqlite_url(db))
    database.upgrade()
    cluster = SimulatedCluster(
        SimConfig(seed=seed, round_s=round_s, mean_interarrival_s=mean_interarrival_s)
    )
    daemon = Daemon(DaemonParts(db=database, backend=cluster, policy=RulesPolicy()))
    daemon.start()
    for _ in range(ticks):
        daemon.tick()
    database.dispose()


def wait_ready(port: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """The daemon's ``readyz`` body once it is ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{port}/api/v1/readyz"
            with urllib.request.urlopen(url, timeout=1) as r:
                body: dict[str, Any] = json.loads(r.read())
                return body
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the daemon did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0, help="Load (and idle) window.")
    parser.add_argument("--warmup", type=float, default=10.0, help="Ticks before measuring.")
    parser.add_argument("--tick-s", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=50, help="Decisions per page.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefill-ticks", type=int, default=150)
    args = parser.parse_args()
    autotune = Path(sys.executable).parent / "autotune"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "autotune.db"
        # Ten simulated minutes per tick and an arrival every 15 (on average): jobs start
        # and finish every few ticks, and the queue stays short enough that a tick's own
        # cost stays flat over the run (the rule-based policy's cost grows with it).
        round_s, mean_interarrival_s = 600.0, 900.0
        prefill(
            db,
            args.prefill_ticks,
            args.seed,
            round_s=round_s,
            mean_interarrival_s=mean_interarrival_s,
        )
        env = {**os.environ, "AUTOTUNE_DATA_DIR": tmp, "AUTOTUNE_TOKEN": "bench"}
        env.update(
            AUTOTUNE_SIM_MEAN_INTERARRIVAL_S=str(mean_interarrival_s),
            AUTOTUNE_ROUND_S=str(round_s),
        )
        daemon = subprocess.Popen(
            [
                str(autotune),
                "daemon",
                "--port",
                str(port),
                "--tick-s",
                str(args.tick_s),
                "--seed",
                str(args.seed),
                "--log-level",
                "WARNING",
            ],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # The daemon's default policy: the learned one, or its rules fallback when
            # the shipped checkpoint does not fit the current spaces (the version says).
            policy_version = wait_ready(port).get("policy_version")
            time.sleep(args.warmup)
            idle_start = time.time()
            time.sleep(args.seconds)
            idle_end = load_start = time.time()
            path = f"/api/v1/decisions?limit={args.limit}"
            latencies, errors = asyncio.run(load(port, path, args.clients, args.seconds))
            load_end = time.time()
            time.sleep(args.tick_s)  # the last tick of the window commits
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/decisions?limit=1") as r:
                decisions = json.loads(r.read())["count"]
            idle = periods(*tick_samples(db, idle_start, idle_end))
            loaded = periods(*tick_samples(db, load_start, load_end))
            load_average = os.getloadavg()
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    result: dict[str, Any] = {
        "date": datetime.now(UTC).date().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}",
        "clients": args.clients,
        "seconds": args.seconds,
        "page_size": args.limit,
        "daemon_policy": policy_version,
        "decisions_in_db": decisions,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / args.seconds, 1),
        "errors": len(errors),
        "latency_ms": {
            "p50": round(1000 * percentile(latencies, 50), 1),
            "p90": round(1000 * percentile(latencies, 90), 1),
            "p99": round(1000 * percentile(latencies, 99), 1),
            "max": round(1000 * max(latencies), 1),
        },
        "load_average_1m_after": round(load_average[0], 2),
        "tick_s": args.tick_s,
        "tick_period_idle": idle,
        "tick_period_under_load": loaded,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "api_latency.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
