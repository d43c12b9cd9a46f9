"""Which of several daemons on one database runs the decision loop.

Every daemon serves the API (reads and writes go to the database); the one holding the
leader lease (``autotune.db.lease``) also decides. ``Leadership`` keeps the lease in a
thread of its own, on a connection of its own: the leader renews it every
``lease_s / 5`` seconds, the others try to take it as often, and take it once it has
expired: within ``lease_s`` plus one try of the leader's last renewal when it dies.

A leader that cannot renew (the database is gone) stops deciding once ``lease_s`` has
passed since its last renewal began (by its own monotonic clock: never later than the
database's expiry); when the database is back it renews the same term if nobody took the
lease meanwhile, and goes on. If somebody did, it has been deposed: the decision loop
hands its backend's jobs back (``Daemon.demote``) and follows.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

from autotune.daemon.log import event
from autotune.db import Database, database_error
from autotune.db import lease as leases

__all__ = ["LeaderStatus", "Leadership", "daemon_id"]


def daemon_id() -> str:
    """``host:pid:random``: unique per daemon process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderStatus:
    """What ``/readyz`` and ``/metrics`` say about leadership."""

    daemon: str
    """This daemon."""
    leading: bool
    """This daemon holds the lease and may decide now."""
    term: int | None
    """The term this daemon holds (``None``: it follows)."""
    leader: str | None
    """The lease's holder as last read (``None``: never held, or not read yet)."""
    leader_term: int | None
    lease_expires_in_s: float | None
    """Seconds until the lease expires as last read (negative: expired)."""
    error: str | None
    """Why the lease could not be read or renewed last time; ``None``: it could."""


class Leadership:
    def __init__(self, db: Database, *, lease_s: float = 5.0, holder: str | None = None) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s={lease_s}: must be > 0")
        self.db = db
        self.lease_s = lease_s
        self.every_s = lease_s / 5
        self.holder = holder or daemon_id()
        self._lock = threading.Lock()
        self._term: int | None = None
        self._valid_until = 0.0  # monotonic
        self._deposed = False
        self._seen: leases.LeaseState | None = None
        self._error: str | None = None
        self._expired_logged = False

    # -- state, read from any thread ---------------------------------------------------

    @property
    def term(self) -> int | None:
        return self._term

    @property
    def leading(self) -> bool:
        """Holds the lease, renewed less than ``lease_s`` ago."""
        with self._lock:
            return self._term is not None and time.monotonic() < self._valid_until

    def take_deposed(self) -> bool:
        """Whether another daemon took the lease since the last call (once)."""
        with self._lock:
            deposed, self._deposed = self._deposed, False
            return deposed

    def status(self) -> LeaderStatus:
        with self._lock:
            seen, term, error = self._seen, self._term, self._error
            leading = term is not None and time.monotonic() < self._valid_until
        return LeaderStatus(
            daemon=self.holder,
            leading=leading,
            term=term,
            leader=None if seen is None else seen.holder,
            leader_term=None if seen is None else seen.term,
            lease_expires_in_s=None if seen is None else round(seen.expires_in_s, 3),
            error=error,
        )

    # -- the lease ----------------------------------------------------------------------

    def step(self) -> None:
        """Renew the lease (leader) or try to take it (follower), once."""
        began = time.monotonic()
        try:
            with self.db.session() as session:
                if self._term is not None:
                    self._renew(session, began)
                else:
                    self._try_acquire(session, began)
                seen = leases.current(session)
        except Exception as exc:  # the database is unreachable: keep trying
            error = database_error(exc)
            if error != self._error:
                event("leader.lease_error", level=logging.WARNING, error=error, term=self._term)
            with self._lock:
                self._error = error
            if self._term is not None and not self.leading and not self._expired_logged:
                self._expired_logged = True
                event(
                    "leader.lease_expired",
                    level=logging.WARNING,
                    term=self._term,
                    reason=f"not renewed for {self.lease_s:g} s: {error}",
                )
            return
        with self._lock:
            self._seen = seen
            if self._error is not None:
                event("leader.lease_ok", term=self._term, after=self._error)
            self._error = None

    def _renew(self, session: Session, began: float) -> None:
        term = self._term
        assert term is not None
        if leases.renew(session, holder=self.holder, term=term, lease_s=self.lease_s):
            with self._lock:
                self._valid_until = began + self.lease_s
            if self._expired_logged:
                self._expired_logged = False
                event("leader.lease_renewed", term=term, holder=self.holder)
            return
        with self._lock:
            self._term = None
            self._valid_until = 0.0
            self._deposed = True
        state = leases.current(session)
        event(
            "leader.deposed",
            level=logging.WARNING,
            term=term,
            holder=self.holder,
            new_term=state.term,
            new_leader=state.holder,
        )

    def _try_acquire(self, session: Session, began: float) -> None:
        term = leases.acquire(session, holder=self.holder, lease_s=self.lease_s)
        if term is None:
            return
        with self._lock:
            self._term = term
            self._valid_until = began + self.lease_s
            self._expired_logged = False
        event("leader.elected", term=term, holder=self.holder)

    def lost(self, term: int) -> None:
        """A fenced write found the lease in another term: ``term`` has ended."""
        with self._lock:
            if self._term == term:
                self._term = None
                self._valid_until = 0.0
                self._deposed = True
        event("leader.deposed", level=logging.WARNING, term=term, holder=self.holder)

    def fence(self, session: Session, term: int) -> None:
        """The fencing check of a transaction that writes as the leader of ``term``
        (``autotune.db.lease.fence``)."""
        leases.fence(session, holder=self.holder, term=term, lease_s=self.lease_s)

    def run(self, stop: threading.Event) -> None:
        """``step`` every ``every_s`` seconds until ``stop``."""
        while not stop.is_set():
            self.step()
            stop.wait(self.every_s)

    def release(self) -> None:
        """Give the lease up (a clean stop), so another daemon takes over at once."""
        term = self._term
        if term is None:
            return
        with self._lock:
            self._term = None
            self._valid_until = 0.0
        try:
            with self.db.session() as session:
                released = leases.release(session, holder=self.holder, term=term)
        except Exception as exc:  # it expires by itself
            event("leader.release_failed", level=logging.WARNING, term=term, error=str(exc))
            return
        if released:
            event("leader.released", term=term, holder=self.holder)
