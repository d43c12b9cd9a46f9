"""ASGI middleware: request body size limit and API latency, in one pass; the audit log
of mutating requests."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autotune.api.metrics import ServiceMetrics
from autotune.core import utc_now
from autotune.daemon.auth import Principal
from autotune.db import Database
from autotune.db import repository as repo

__all__ = ["AuditLog", "BodyLimitAndTiming"]

_log = logging.getLogger(__name__)


class _TooLarge(HTTPException):
    """Raised from ``receive`` while the endpoint reads the body: FastAPI passes HTTP
    exceptions through (others become a 400), so the client gets this 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            status_code=413,
            detail=[{"loc": ["body"], "msg": f"request body larger than {limit} bytes"}],
        )


async def _reject(send: Send, limit: int) -> None:
    body = (
        b'{"detail":[{"loc":["body"],"msg":"request body larger than '
        + str(limit).encode()
        + b' bytes","type":"too_large"}]}'
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitAndTiming:
    """413 for bodies over ``max_body_bytes`` (by Content-Length, or counted as they
    stream in), and every request's latency into ``metrics``."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: ServiceMetrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        limit = self.max_body_bytes
        status = 500
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_large = int(value) > limit
                except ValueError:
                    too_large = False
                if too_large:
                    await _reject(send, limit)
                    self._observe(scope, 413, started)
                    return
        received = 0
        started_response = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal status, started_response
            if message["type"] == "http.response.start":
                status = int(message["status"])
                started_response = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started_response:
                await _reject(send, limit)
            status = 413
        finally:
            self._observe(scope, status, started)

    def _observe(self, scope: dict[str, Any] | Scope, status: int, started: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        self.metrics.api_latency.labels(scope["method"], template, str(status)).observe(
            time.perf_counter() - started
        )


_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class AuditLog:
    """Every request that may change something (any method but GET, HEAD, OPTIONS) under
    ``prefix`` goes into the audit log: which token made it (the principal the token
    check put in the request's state; none for a missing or invalid token), the method,
    the path and the status answered. The entry is committed before the answer leaves,
    so a client that got its answer finds the entry; a database that cannot take it is
    logged and does not change the answer."""

    def __init__(self, app: ASGIApp, *, db: Database, prefix: str) -> None:
        self.app = app
        self.db = db
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in _READS
            or not scope["path"].startswith(self.prefix)
        ):
            await self.app(scope, receive, send)
            return

        async def auditing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                await self._record(scope, int(message["status"]))
            await send(message)

        await self.app(scope, receive, auditing_send)

    async def _record(self, scope: Scope, status: int) -> None:
        principal: Principal | None = scope.get("state", {}).get("principal")
        entry: dict[str, Any] = {
            "at": utc_now(),
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
        }
        if principal is not None:
            entry.update(
                token_id=principal.token_id,
                token_name=principal.token_name,
                tenant=principal.tenant,
                role=principal.role,
            )

        def write() -> None:
            with self.db.session() as session:
                repo.record_audit(session=session, **entry)

        try:
            await anyio.to_thread.run_sync(write)
        except Exception as exc:
            _log.warning("audit entry not written (%s %s %d): %s", *entry.values(), exc)
