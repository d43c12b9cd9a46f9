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

from autotune.api.app import create_app
from autotune.daemon.auth import TokenCheck, hash_token
from autotune.db import Database

TOKEN = "commit-order-token"


@pytest.fixture
def slow_commit_api(database: Database) -> Iterator[str]:
    """The API on a live server whose database commits take 0.5 s each."""

    def slow(session: Session) -> None:
        time.sleep(0.5)

    event.listen(Session, "before_commit", slow)
    app = create_app(
        db=database, telemetry="simulator", token_check=TokenCheck([hash_token(TOKEN)])
    )
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
    status, job = call(
        "POST", f"{slow_commit_api}/jobs", {"task": "gpt-char", "job_id": "mine", "steps": 10}
    )
    assert status == 201, job
    status, shown = call("GET", f"{slow_commit_api}/jobs/mine")
    assert status == 200, shown
    assert shown["state"] == "pending"
