"""Hosting the daemon: its decision loop, the REST API, the leader lease and retention
in one process, until SIGINT or SIGTERM stops them in order (``serve``).

The decision loop (``autotune.daemon.tick.Daemon.run``) ticks in a thread of its own, the
API (``autotune.api.app``) on uvicorn's event loop, the leader lease and retention in
threads of their own, each on its own database connections, so none waits for another.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import uvicorn

from autotune.core import utc_now
from autotune.daemon.health import error_text
from autotune.daemon.log import event
from autotune.daemon.tick import Daemon
from autotune.db import Database
from autotune.db.retention import RetentionPolicy, run_retention

__all__ = ["retention_loop", "serve"]


def retention_loop(
    db: Database,
    policy: RetentionPolicy,
    every_s: float,
    stop: threading.Event,
    duty: float = 0.2,
    leading: Callable[[], bool] | None = None,
) -> None:
    """Apply ``policy`` now and every ``every_s`` seconds until ``stop``: short
    transactions working ``duty`` of the time (``autotune.db.retention``), on ``db``'s
    own connection, so ticks and reads never wait more than one of them. ``leading``:
    whether this daemon leads (only the leader applies retention); ``None``: it does."""
    while not stop.is_set():
        if leading is not None and not leading():
            stop.wait(min(every_s, 1.0))
            continue
        try:
            report = run_retention(
                db, policy, utc_now(), pause_s=0.01, duty=duty, should_stop=stop.is_set
            )
        except Exception as exc:  # logged and retried at the next pass
            event("retention.failed", level=logging.WARNING, error=error_text(exc))
        else:
            if report.rows_touched:
                event(
                    "retention",
                    deleted=report.deleted,
                    downsampled=report.metrics_downsampled,
                    written=report.metrics_written,
                    steps=report.steps,
                    seconds=round(report.elapsed_s, 2),
                    longest_step_s=round(report.max_step_s, 4),
                )
        stop.wait(every_s)


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: ``serve`` installs the daemon's
    for the whole stop, not only while requests are served."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(
    daemon: Daemon,
    *,
    host: str,
    port: int,
    tick_s: float,
    telemetry: str,
    api_db: Database | None = None,
    stop_timeout_s: float = 10.0,
    retention: RetentionPolicy | None = None,
    retention_every_s: float = 300.0,
    retention_duty: float = 0.2,
    **app_options: Any,
) -> None:
    """Run the decision loop and the API until SIGINT or SIGTERM; ``app_options`` go to
    ``autotune.api.app.create_app`` (token check, task allow-list, body limit, ...).

    ``api_db``: the API's own connections to the daemon's database (default: a second
    ``Database`` on the same URL), so readers never hold the connection a tick needs.
    ``retention``: applied every ``retention_every_s`` seconds in a thread of its own, on
    a third connection (``None``: history is kept forever), by the leader only.

    With ``daemon.leadership``, a fourth connection keeps the leader lease; the decision
    loop ticks only while this daemon leads (taking over when it comes to lead), and the
    lease is released once the backend has checkpointed its jobs at the stop.

    A signal stops everything within ``stop_timeout_s``: the API stops accepting and
    cuts requests still running after a third of it, the decision loop finishes its
    tick (a tick never applies what it has not committed), the backend checkpoints its
    running jobs with what is left. A second signal exits at once."""
    from autotune.api.app import attach_daemon, create_app

    api_db = api_db or Database(daemon.db.url)
    app = create_app(db=api_db, telemetry=telemetry, **app_options)
    attach_daemon(app, daemon)
    grace_s = stop_timeout_s / 3
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, round(grace_s)),
        )
    )
    stop = threading.Event()
    stopping_since: list[float] = []

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stopping_since:
            event("daemon.signal", level=logging.WARNING, signal=name, action="exit now")
            logging.shutdown()
            os._exit(128 + signum)
        stopping_since.append(time.monotonic())
        server.should_exit = True
        stop.set()
        event("daemon.signal", signal=name, action="stop", within_s=stop_timeout_s)

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def left() -> float:
        started = stopping_since[0] if stopping_since else time.monotonic()
        return max(0.0, started + stop_timeout_s - time.monotonic())

    # A daemon thread: a tick still running when the time is up does not hold the exit
    # (what it committed stays; what it did not commit never was).
    loop = threading.Thread(
        target=daemon.run, args=(stop, tick_s), name="decision-loop", daemon=True
    )

    leadership = daemon.leadership
    housekeeping = None
    if retention is not None:
        retention_db = Database(daemon.db.url, pool_size=1)
        housekeeping = threading.Thread(
            target=retention_loop,
            args=(retention_db, retention, retention_every_s, stop, retention_duty),
            kwargs={"leading": None if leadership is None else (lambda: leadership.leading)},
            name="retention",
            daemon=True,
        )
    lease_keeper = None
    if leadership is not None:
        lease_keeper = threading.Thread(
            target=leadership.run, args=(stop,), name="leader-lease", daemon=True
        )

    async def _main() -> None:
        if lease_keeper is not None:
            lease_keeper.start()
        loop.start()
        if housekeeping is not None:
            housekeeping.start()
        try:
            await server.serve()
        finally:
            stop.set()
            await asyncio.to_thread(loop.join, max(0.0, left() - stop_timeout_s / 3))
            if loop.is_alive():
                event("daemon.stop_tick_cut", level=logging.WARNING)

    if leadership is None:
        daemon.start()
    else:
        leadership.step()  # a daemon that finds the lease free decides from the start
        if leadership.leading and leadership.term is not None:
            daemon.take_over(leadership.term, activate=True)
        else:
            status = leadership.status()
            event(
                "leader.following",
                leader=status.leader,
                term=status.leader_term,
                expires_in_s=status.lease_expires_in_s,
                error=status.error,
            )
    # What start-up built (the policy, the app, the simulator) lives as long as the
    # process: out of the collector's sight, full collections stop scanning it, and the
    # API's latency loses their pauses.
    gc.collect()
    gc.freeze()
    event("api.listen", url=f"http://{host}:{port}/api/v1")
    try:
        # uvicorn's choice of event loop: uvloop where installed.
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            runner.run(_main())
    finally:
        try:
            deciding = leadership is None or daemon.term is not None
            if not loop.is_alive() and deciding:  # a tick still running holds the log
                try:
                    daemon.stop()
                except Exception as exc:  # the backend's jobs are checkpointed regardless
                    event("daemon.stop_failed", level=logging.WARNING, error=error_text(exc))
            daemon.backend.close(timeout_s=left())
            if leadership is not None:  # after the checkpoints: the next leader resumes them
                leadership.release()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            api_db.dispose()
            if housekeeping is not None:
                retention_db.dispose()
            if leadership is not None:
                leadership.db.dispose()
            daemon.db.dispose()
            event("daemon.stop")
