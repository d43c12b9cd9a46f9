"""A stop that is always prompt: SIGTERM under load ends the daemon within its stop
timeout with nothing committed lost, and a second signal exits at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import Api, autotune_command, free_port, wait_for
from sqlalchemy import select

from autotune.db import Database, sqlite_url
from autotune.db.tables import DecisionRow

pytestmark = pytest.mark.subprocess


def _start(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AUTOTUNE_DATA_DIR": str(tmp_path / "data"), "AUTOTUNE_TOKEN": "t"}
    for key in ("AUTOTUNE_DB_URL", "AUTOTUNE_CONFIG"):
        env.pop(key, None)
    log = (tmp_path / "daemon.log").open("wb")
    return subprocess.Popen(
        [
            *autotune_command(),
            "daemon",
            "--port",
            str(port),
            "--tick-s",
            "0.3",
            "--policy",
            "rules",
            "--sim-initial-jobs",
            "20",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=log,
    )


def test_sigterm_under_load_stops_within_the_timeout_and_loses_nothing(tmp_path: Path) -> None:
    port = free_port()
    daemon = _start(tmp_path, port)
    try:
        api = Api(port)
        wait_for("decisions", lambda: api.get("/decisions?limit=1")["count"] > 0, timeout_s=120)
        seen: set[int] = set()
        done = threading.Event()

        def read() -> None:  # four readers back to back until the daemon is gone
            while not done.is_set():
                try:
                    page = api.get("/decisions?limit=50")
                    api.get("/cluster")
                except Exception:
                    continue
                seen.update(row["id"] for row in page["data"])

        readers = [threading.Thread(target=read) for _ in range(4)]
        for reader in readers:
            reader.start()
        time.sleep(3)
        signalled = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=30)
        took = time.monotonic() - signalled
        done.set()
        for reader in readers:
            reader.join()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert code == 0, (tmp_path / "daemon.log").read_text()[-2000:]
    assert took < 10
    assert seen
    database = Database(sqlite_url(tmp_path / "data" / "autotune.db"))
    with database.session() as session:
        stored = set(session.scalars(select(DecisionRow.id).where(DecisionRow.id.in_(seen))))
    database.dispose()
    assert stored == seen
    log = (tmp_path / "daemon.log").read_text()
    assert '"daemon.stop"' in log


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    port = free_port()
    daemon = _start(tmp_path, port)
    try:
        api = Api(port)
        wait_for("decisions", lambda: api.get("/decisions?limit=1")["count"] > 0, timeout_s=120)
        # A request left half-sent holds the graceful stop (up to its grace period), so
        # the second signal surely comes while the first is being honoured.
        with socket.create_connection(("127.0.0.1", port)) as held:
            held.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.2)
            daemon.send_signal(signal.SIGTERM)
            log = tmp_path / "daemon.log"
            wait_for("the first signal", lambda: "daemon.signal" in log.read_text(), 10)
            signalled = time.monotonic()
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=10)
            took = time.monotonic() - signalled
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert code == 128 + signal.SIGTERM
    assert took < 2
    assert "exit now" in (tmp_path / "daemon.log").read_text()
