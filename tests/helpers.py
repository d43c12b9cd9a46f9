"""Helpers shared by the tests."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.benchmarks import postgres_bin

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


REQUIRE_POSTGRES = "AUTOTUNE_REQUIRE_POSTGRES"
"""Set (CI sets it) to make the tests that need a PostgreSQL server fail, not skip, when
they cannot start one."""
REQUIRE_TESTBED = "AUTOTUNE_REQUIRE_TESTBED"
"""Set (CI sets it) to make the testbed's tests fail, not skip, on a host that cannot
build one (no root, no ``ip netns``, no ``tc``)."""


def no_postgres(why: str) -> None:
    """Skip the test for want of PostgreSQL, or fail it where PostgreSQL is required."""
    import os

    import pytest

    if os.environ.get(REQUIRE_POSTGRES):
        pytest.fail(f"{why} ({REQUIRE_POSTGRES} is set)")
    pytest.skip(why)


class PostgresServer:
    """A throwaway PostgreSQL server from the installed binaries, on a free port, that a
    test (or a benchmark) can stop and start again: ``url`` is its admin database.

    Run as root, the server runs as the ``postgres`` user (initdb refuses root)."""

    def __init__(self) -> None:
        import os
        import pwd
        import subprocess
        import tempfile

        bin_dir = postgres_bin()
        if bin_dir is None or not (bin_dir / "initdb").exists():
            raise FileNotFoundError("no PostgreSQL binaries (initdb, pg_ctl): install postgresql")
        self.bin_dir = bin_dir
        self.prefix: list[str] = []
        # Not under pytest's tmp dir: that one is private to the user running the tests.
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")  # KeyError: no user to run the server as
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data, self.port = self.root / "data", free_port()
        initdb = [str(bin_dir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "autotune"]
        subprocess.run(
            [*self.prefix, *initdb],
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql+psycopg://autotune@127.0.0.1:{self.port}/postgres"
        self.start()

    def _ctl(self, *args: str, check: bool = True) -> None:
        import subprocess

        subprocess.run(
            [*self.prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args],
            check=check,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: clients are disconnected, committed work is kept (an outage);
        ``immediate``: the server is killed."""
        self._ctl("-m", mode, "-w", "stop")

    def create_database(self) -> str:
        """A fresh, empty database on it: its URL."""
        import uuid

        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        name = f"autotune_test_{uuid.uuid4().hex[:12]}"
        admin = create_engine(self.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return make_url(self.url).set(database=name).render_as_string(False)

    def close(self) -> None:
        import shutil

        self._ctl("-m", "immediate", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


class DaemonProcess:
    """``autotune daemon`` in a child process on the built-in simulated cluster, with its
    data in ``tmp_path / data_dir`` and its output in ``tmp_path / <name>.out|.err``."""

    def __init__(
        self,
        tmp_path: Path,
        port: int,
        name: str,
        db_url: str | None = None,
        *,
        tick_s: float = 0.4,
        jobs: tuple[int, int] = (0, 0),
        data_dir: str = "data",
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """``jobs``: the simulator's ``(initial, max)`` jobs of its own stream (``(0,
        0)``: only those submitted through the API)."""
        import os
        import subprocess

        self.port = port
        # No exploration: tests count the decisions a job gets, and an explored `change`
        # entry may reconfigure a running job's unpinned fields at any tick.
        environ = {
            **os.environ,
            "AUTOTUNE_DATA_DIR": str(tmp_path / data_dir),
            "AUTOTUNE_EXPLORATION_EPSILON": "0",
        }
        for key in ("AUTOTUNE_DB_URL", "AUTOTUNE_CONFIG", "AUTOTUNE_TOKEN"):
            environ.pop(key, None)
        if db_url is not None:
            environ["AUTOTUNE_DB_URL"] = db_url
        environ.update(env or {})
        self.stdout_path = tmp_path / f"{name}.out"
        self.stderr_path = tmp_path / f"{name}.err"
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(
                [
                    *autotune_command(),
                    "daemon",
                    "--port",
                    str(port),
                    "--tick-s",
                    str(tick_s),
                    "--sim-initial-jobs",
                    str(jobs[0]),
                    "--sim-max-jobs",
                    str(jobs[1]),
                    *extra,
                ],
                cwd=tmp_path,
                env=environ,
                stdout=out,
                stderr=err,
            )

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON log lines it wrote to stderr so far."""
        events = []
        for line in self.stderr_path.read_text().splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events

    def api_token(self) -> str:
        """The API token the daemon printed on its first start (waits for the line)."""
        line = wait_for(
            "the token line",
            lambda: next(
                (ln for ln in self.stdout_path.read_text().splitlines() if "API token" in ln),
                None,
            ),
        )
        return str(line.rsplit(" ", 1)[1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


HEADLESS_CHROMIUM = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""Chromium's flags for a page rendered here: no sandbox (root in CI), no GPU, nothing
fetched from outside."""


def next_snapshot(cluster: Any) -> Any:
    """What a daemon's tick observes of a simulated cluster: one round of simulated time
    passes (the first call only starts the cluster), then the snapshot."""
    cluster.run_round()
    return cluster.observe()


MIB = 1 << 20


def gpu_properties(
    name: str, memory_mib: int, sms: int, cc: tuple[int, int], clock_mhz: float | None = None
) -> Any:
    """A GPU's properties as the readers return them (``GpuProperties``), memory as
    nvidia-smi reports it (MiB)."""
    from autotune.catalog.detect import GpuProperties

    return GpuProperties(
        name=name,
        total_memory_bytes=memory_mib * MIB,
        multiprocessor_count=sms,
        major=cc[0],
        minor=cc[1],
        clock_mhz=clock_mhz,
    )
