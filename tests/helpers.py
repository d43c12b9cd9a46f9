"""Helpers shared by the tests."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
"""The repository's root."""
SHARED_DATA = REPO.parent / "shared" / "data"
"""The public traces, beside the checkout (absent on a bare clone: their tests skip)."""


def autotune_command() -> list[str]:
    """The installed ``autotune`` entry point, as a user runs it."""
    script = Path(sys.executable).parent / "autotune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "autotune.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def call(
        self, method: str, path: str, body: object | None = None, token: str | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body)
        return body


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError:
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def cli(*args: str) -> Any:
    """``autotune ARGS`` run in this process by typer's ``CliRunner`` (the result has
    ``exit_code``, ``stdout`` and ``stderr``): the fast way to check a command's exit codes
    and messages; one test per command runs the installed entry point instead."""
    from typer.testing import CliRunner

    from autotune.cli import app

    return CliRunner().invoke(app, list(args))


def train(
    task: str,
    cfg: Any,
    steps: int,
    *,
    on_step: Callable[..., None] | None = None,
    **kwargs: Any,
) -> Any:
    """Train ``task`` under the ``JobConfig`` ``cfg`` for ``steps`` steps with a
    ``JobRunner`` (on the test run's Ray); ``kwargs`` go to ``RunnerConfig``. Returns the
    ``JobResult``."""
    from autotune.executor.runner import JobRunner, RunnerConfig

    run = RunnerConfig(task=task, steps=steps, **kwargs)
    return JobRunner(run, cfg, on_step=on_step).run()
