"""How the decision loop is doing: a tick's report, the loop's health, and whether a
failure was the database's (then the loop pauses rather than counting a failed tick).
``GET /readyz`` and ``/metrics`` read these (``autotune.api``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from autotune.core import Decision

__all__ = ["TickHealth", "TickReport", "database_unavailable", "error_text"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TickReport:
    time_s: float
    decisions: list[Decision]
    unplaced: dict[str, str]
    duration_s: float
    running: int
    pending: int
    gpu_utilization: float
    fallback: bool = False
    """The fallback policy decided this tick: the daemon's own policy failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TickHealth:
    """How the decision loop is doing: what ``GET /readyz`` and ``/metrics`` report."""

    consecutive_failures: int = 0
    """Failed ticks in a row; a tick decided by the daemon's own policy resets it (a tick
    the fallback decided leaves it as it is)."""
    failures_total: int = 0
    """Failed ticks since the daemon started."""
    last_error: str | None = None
    """``Type: message`` of the newest failure: of a tick, or of the daemon's own policy
    in a tick the fallback then decided."""
    last_failure_at: datetime | None = None
    fallback: str | None = None
    """The fallback policy's name while the daemon decides with it; ``None``: it does
    not."""
    paused: str | None = None
    """Why ticks are paused (the database cannot take them, or the leader lease could not
    be renewed); ``None``: they are not."""
    paused_since: datetime | None = None

    @property
    def ok(self) -> bool:
        """The last tick succeeded and the daemon's own policy decided it."""
        return self.consecutive_failures == 0 and self.fallback is None and self.paused is None

    def describe(self) -> str | None:
        """Why the loop is not ok, in words; ``None`` when it is."""
        if self.ok:
            return None
        if self.paused is not None and self.consecutive_failures == 0:
            return f"ticks paused since {self.paused_since:%H:%M:%S}: {self.paused}"
        text = f"{self.consecutive_failures} consecutive failed tick(s); last error: "
        text += str(self.last_error)
        if self.fallback is not None:
            text += f"; deciding with the fallback policy {self.fallback}"
        if self.paused is not None:
            text += f"; ticks paused: {self.paused}"
        return text


def database_unavailable(exc: BaseException) -> bool:
    """The database cannot take the work now (unreachable, connection lost, locked, full,
    read-only, no connection free): the work may succeed later as it is."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def error_text(exc: BaseException) -> str:
    """``Type: message`` (the message cut at 500 characters)."""
    message = str(exc)
    if len(message) > 500:
        message = message[:497] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
