"""Daemons as users run them on a real PostgreSQL server: two on one database, the leader
SIGKILLed under load, and the database stopped under load."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, PostgresServer, free_port, wait_for
from sqlalchemy import func, select

from autotune.benchmarks.api_load import decision_ids
from autotune.db import Database
from autotune.db import lease as leases
from autotune.db.tables import DecisionRow

pytestmark = pytest.mark.subprocess

TOKEN = "failover-test-token"
TICK_S = 0.5
OPTIONS = ("--policy", "rules", "--forecast", "persistence")


def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            body = r.read()
            return r.status, json.loads(body) if body.startswith((b"{", b"[")) else body
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _ready(port: int) -> dict[str, Any] | None:
    try:
        status, body = _get(port, "/api/v1/readyz", timeout=5)
    except OSError:
        return None
    return body if status == 200 else None


class Load:
    """Reads at a steady rate against some daemons (newest decisions, jobs, cluster,
    readiness, metrics) in a thread: what each answered, how long it took, and every
    decision id a client was shown."""

    PATHS = (
        "/api/v1/decisions?limit=20",
        "/api/v1/jobs?limit=20",
        "/api/v1/cluster",
        "/api/v1/readyz",
        "/metrics",
    )

    def __init__(self, ports: list[int], rate: float = 20.0) -> None:
        self.ports = ports
        self.rate = rate
        self.answers: list[tuple[int, str, int | str, float]] = []
        """``(port, path, status or the exception's name, seconds)``."""
        self.seen_decisions: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            port = self.ports[i % len(self.ports)]
            path = self.PATHS[i % len(self.PATHS)]
            i += 1
            started = time.monotonic()
            try:
                status, body = _get(port, path)
            except OSError as exc:  # refused: a daemon that was killed
                self.answers.append((port, path, type(exc).__name__, time.monotonic() - started))
            else:
                self.answers.append((port, path, status, time.monotonic() - started))
                if status == 200 and path.startswith("/api/v1/decisions"):
                    self.seen_decisions.update(d["id"] for d in body["data"])
            self._stop.wait(max(0.0, 1 / self.rate - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def statuses(self, port: int) -> Counter[int | str]:
        return Counter(status for p, _, status, _ in self.answers if p == port)


def _daemon(tmp_path: Path, name: str, url: str) -> DaemonProcess:
    return DaemonProcess(
        tmp_path,
        free_port(),
        name,
        url,
        tick_s=TICK_S,
        jobs=(6, 60),
        data_dir=name,
        extra=OPTIONS,
        env={"AUTOTUNE_TOKEN": TOKEN},
    )


def test_a_follower_takes_over_a_sigkilled_leader_within_10_s_and_no_decision_is_lost(
    private_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = private_postgres.create_database()
    started: list[DaemonProcess] = []
    try:
        a = _daemon(tmp_path, "a", url)
        started.append(a)
        first = wait_for(
            "a leads", lambda: (r := _ready(a.port)) and r["leader"]["leading"] and r, timeout_s=120
        )
        b = _daemon(tmp_path, "b", url)
        started.append(b)
        ready_b = wait_for("b is ready and follows", lambda: _ready(b.port), timeout_s=120)
        assert ready_b["leader"]["leading"] is False
        assert ready_b["leader"]["leader"] == first["leader"]["daemon"]
        load = Load([a.port, b.port])
        # A job submitted through the follower is decided by the leader.
        request = urllib.request.Request(
            f"http://127.0.0.1:{b.port}/api/v1/jobs",
            data=json.dumps({"job_id": "through-b", "task": "gpt-char", "steps": 10**9}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201
        wait_for(
            "the leader runs the job submitted through the follower",
            lambda: _get(b.port, "/api/v1/jobs/through-b")[1]["state"] == "running",
            timeout_s=30,
        )
        wait_for("decisions", lambda: len(decision_ids(url)) >= 10, timeout_s=60)
        a.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            "b leads",
            lambda: (r := _ready(b.port)) and r["leader"]["leading"],
            timeout_s=20,
        )
        took_over_s = time.monotonic() - killed
        database = Database(url)
        wait_for(
            "a decision of the new term",
            lambda: len(leases_terms(database)) == 2 and leases_terms(database)[1][2] > 0,
            timeout_s=20,
        )
        time.sleep(2)
        load.stop()
        history = leases_terms(database)
        (_, holder_a, n_a, _, last_a), (_, holder_b, n_b, first_b, _) = history
        assert holder_a == first["leader"]["daemon"]
        assert holder_b == ready_b["leader"]["daemon"]
        assert n_a > 0
        assert n_b > 0
        assert last_a < first_b  # one leader at a time: no decision of a after b's first
        with database.session() as session:
            unapplied = session.scalar(
                select(func.count())
                .select_from(DecisionRow)
                .where(DecisionRow.applied_at.is_(None))
            )
        database.dispose()
        assert took_over_s <= 10
        # Every decision a client was shown is still there; none was ever left unapplied
        # but the killed leader's last round.
        assert load.seen_decisions
        assert load.seen_decisions <= decision_ids(url)
        assert unapplied <= 10
        statuses_b = load.statuses(b.port)
        assert set(statuses_b) == {200}, statuses_b  # the follower answered throughout
        assert max(seconds for *_, seconds in load.answers) < 10
        assert _get(b.port, "/api/v1/jobs/through-b")[1]["state"] == "running"
        metrics = _get(b.port, "/metrics")[1].decode()
        assert f'autotune_leader{{daemon="{holder_b}"}} 1.0' in metrics
    finally:
        for daemon in started:
            daemon.stop()


def leases_terms(database: Database) -> list[tuple[int, str, int, int | None, int | None]]:
    with database.session() as session:
        return leases.terms(session)


def test_the_database_stopped_under_load_gives_503s_pauses_ticks_and_loses_nothing(
    private_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = private_postgres.create_database()
    daemon = _daemon(tmp_path, "only", url)
    try:
        wait_for("ready", lambda: _ready(daemon.port), timeout_s=120)
        load = Load([daemon.port])
        wait_for("decisions", lambda: len(decision_ids(url)) >= 5, timeout_s=60)
        before = decision_ids(url)
        private_postgres.stop("fast")
        time.sleep(8)  # longer than the leader lease: it must renew its own term after
        assert daemon.process.poll() is None
        private_postgres.start()
        back = time.monotonic()
        wait_for("ready again", lambda: _ready(daemon.port), timeout_s=30)
        wait_for("a new decision", lambda: max(decision_ids(url)) > max(before), timeout_s=30)
        recovered_s = time.monotonic() - back
        time.sleep(1)
        load.stop()
        assert daemon.process.poll() is None  # nothing crashed
        statuses = load.statuses(daemon.port)
        assert statuses[503] > 0, statuses  # the outage was seen
        assert set(statuses) <= {200, 503}, statuses  # never a 500, never a hang
        assert max(seconds for *_, seconds in load.answers) < 10
        assert before <= decision_ids(url)
        assert load.seen_decisions <= decision_ids(url)
        events = [e["event"] for e in daemon.log_events()]
        assert "tick.paused" in events
        assert "tick.resumed" in events
        paused = next(e for e in daemon.log_events() if e["event"] == "tick.paused")
        assert "database" in paused["reason"]
        assert recovered_s < 10
    finally:
        daemon.stop()
