"""A write the API answers 2xx to is committed before the answer: a client reads its
own write on its next request, however slow the commit is."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from sqlalchemy import event
from sqlalchemy.orm import Session

from autotune.api.app import attach_daemon, create_app
from autotune.daemon.auth import TokenCheck, hash_token
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy

TOKEN = "commit-order-token"


@pytest.fixture(params=["api", "with-daemon"])
def slow_commit_api(database: Database, request: pytest.FixtureRequest) -> Iterator[str]:
    """The API on a live server whose database commits take 0.5 s each; alone, or with a
    decision loop attached (its reads are then kept from one tick to the next)."""

    def slow(session: Session) -> None:
        time.sleep(0.5)

    app = create_app(
        db=database, telemetry="simulator", token_check=TokenCheck([hash_token(TOKEN)])
    )
    if request.param == "with-daemon":
        cluster = SimulatedCluster(SimConfig(seed=0, initial_jobs=0, max_jobs=0))
        daemon = Daemon(DaemonParts(db=database, backend=cluster, policy=RulesPolicy()))
        daemon.start()
        attach_daemon(app, daemon)
    event.listen(Session, "before_commit", slow)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        event.remove(Session, "before_commit", slow)


def call(method: str, url: str, body: object | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), method=method
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_submitted_job_is_there_on_the_next_request(slow_commit_api: str) -> None:
    assert call("GET", f"{slow_commit_api}/jobs")[1]["count"] == 0  # kept, with a daemon
    status, job = call(
        "POST", f"{slow_commit_api}/jobs", {"task": "gpt-char", "job_id": "mine", "steps": 10}
    )
    assert status == 201, job
    status, shown = call("GET", f"{slow_commit_api}/jobs/mine")
    assert status == 200, shown
    assert shown["state"] == "pending"
    status, listed = call("GET", f"{slow_commit_api}/jobs")
    assert [j["job_id"] for j in listed["data"]] == ["mine"]
