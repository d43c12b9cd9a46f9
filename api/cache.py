"""Reads that change once per tick, answered once per tick.

In the daemon's process the decision loop is what changes the cluster, the jobs and the
decision log, once per tick; between two ticks only the API's own writes do. So the
responses of the busiest listings (``GET /cluster``, ``/jobs``, ``/decisions``,
``/forecast``, ``/dashboard`` with their query strings) are kept from the first request
after a tick until the next tick commits, or until a request in this process changes
something (any method but GET/HEAD): a client always reads what was committed before
its request, as without the cache. Only where a decision loop runs in the same process
(``autotune.api.app.attach_daemon``); an API on its own reads the database every time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autotune.core import ACTIVE_STATES, JOB_STATES
from autotune.db import repository as repo

__all__ = ["CachedReads", "JobCounts", "TickCache"]

CACHED_PATHS = (
    "/api/v1/cluster",
    "/api/v1/jobs",
    "/api/v1/decisions",
    "/api/v1/forecast",
    "/api/v1/dashboard",
)
"""Paths whose GET responses are kept until the next tick (exact paths: not one job's
or one decision's page, which are cheap and rarely asked twice)."""
PER_READER_PATHS = ("/api/v1/jobs", "/api/v1/decisions", "/api/v1/dashboard")
"""Those whose answer depends on who reads when reads are per tenant (``reads=tenant``):
then never kept (each request checks its token and sees its tenant's jobs)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    headers: list[tuple[bytes, bytes]]
    body: bytes
    route: Any
    """The route that answered (Starlette's), so a kept answer is timed under it."""


class TickCache:
    """Responses by request target, dropped at every tick and every write; at most
    ``max_entries`` of them (the oldest go first)."""

    def __init__(self, max_entries: int = 256, serving: Callable[[], bool] | None = None) -> None:
        """``serving``: whether the cache may be used now (``None``: always); while it
        says no, every read goes to the database."""
        self.max_entries = max_entries
        self.serving = serving
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._generation = 0
        self._writes = 0
        self.hits = 0
        self.misses = 0

    @property
    def generation(self) -> int:
        return self._generation

    def clear(self) -> None:
        """Something changed: nothing kept so far may be served again."""
        with self._lock:
            self._entries.clear()
            self._generation += 1

    def begin_write(self) -> None:
        """A request that may write starts: nothing is kept until it has ended."""
        with self._lock:
            self._writes += 1
            self._entries.clear()
            self._generation += 1

    def end_write(self) -> None:
        with self._lock:
            self._writes -= 1
            self._entries.clear()
            self._generation += 1

    def get(self, key: bytes) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
            return entry

    def put(self, key: bytes, generation: int, entry: _Entry) -> None:
        """Keep a response computed in ``generation`` (dropped if a change came since)."""
        with self._lock:
            if generation != self._generation or self._writes:
                return
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


class CachedReads:
    """ASGI middleware serving ``CACHED_PATHS`` from ``cache`` (when there is one:
    ``app.state.tick_cache``) and clearing it on every request that may write."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cache: TickCache | None = getattr(scope["app"].state, "tick_cache", None)
        if cache is None:
            await self.app(scope, receive, send)
            return
        if cache.serving is not None and not cache.serving():
            cache.clear()  # nothing kept from an earlier time this process decided
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            # Reads while it runs go to the database (they see its commit as soon as it
            # is made) and are not kept; what was kept before it is dropped.
            cache.begin_write()
            try:
                await self.app(scope, receive, send)
            finally:
                cache.end_write()
            return
        if scope["path"] not in CACHED_PATHS or (
            scope["path"] in PER_READER_PATHS
            and getattr(scope["app"].state, "reads", "open") != "open"
        ):
            await self.app(scope, receive, send)
            return
        key = scope["method"].encode() + b" " + scope["path"].encode() + b"?"
        key += scope.get("query_string", b"")
        hit = cache.get(key)
        if hit is not None:
            if hit.route is not None:  # for the latency metric's route label
                scope["route"] = hit.route
            await send({"type": "http.response.start", "status": 200, "headers": hit.headers})
            await send({"type": "http.response.body", "body": hit.body})
            return
        generation = cache.generation
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def keep(message: Message) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False) and status == 200:
                    entry = _Entry(headers, b"".join(chunks), scope.get("route"))
                    cache.put(key, generation, entry)
            await send(message)

        await self.app(scope, receive, keep)


class JobCounts:
    """Jobs per state for ``/cluster``, ``/metrics`` and the dashboard: pending and
    running counted at every call (two short index ranges), the final states (finished,
    failed, cancelled: most of a long history, and they only change when a job ends) at
    most every ``final_every_s`` seconds."""

    def __init__(self, final_every_s: float = 30.0) -> None:
        self.final_every_s = final_every_s
        self._lock = threading.Lock()
        self._final: dict[str, int] | None = None
        self._final_at = 0.0

    def read(self, session: Session) -> dict[str, int]:
        counts = repo.job_counts(session=session, states=ACTIVE_STATES)
        with self._lock:
            final, counted_at = self._final, self._final_at
        if final is None or time.monotonic() - counted_at > self.final_every_s:
            states = [s for s in JOB_STATES if s not in ACTIVE_STATES]
            final = repo.job_counts(session=session, states=states)
            with self._lock:
                self._final, self._final_at = final, time.monotonic()
        return {state: counts.get(state, final.get(state, 0)) for state in JOB_STATES}
