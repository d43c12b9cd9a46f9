"""The leader lease: several daemons on one database, one of them deciding.

One row of ``leader_lease`` says which daemon runs the decision loop (``holder``), until
when (``expires_at_s``, on the database's clock) and in which ``term``. The holder renews
it every second or so; another daemon takes it only once it has expired, and taking it
adds one to ``term``. Every transaction that writes decisions first renews the lease *for
its own term* (``fence``): once another daemon has taken the lease, that statement
matches no row and the transaction is rolled back (``LeaseLostError``), so a daemon that was
paused, cut off or slow can never store (and so never apply) a decision after its term
ended. The lease's timing only decides how soon a dead leader is replaced; the term is
what keeps two leaders from both deciding.

The statements are single-row ``UPDATE``s with their condition in the ``WHERE``: atomic
on PostgreSQL (the row lock; a concurrent taker re-checks the condition after waiting)
and on SQLite (one writer at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, select, update
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement

from autotune.core import utc_now
from autotune.db.tables import DecisionRow, LeaderLeaseRow, LeaderTermRow

__all__ = [
    "DECISION_LOOP",
    "LeaseLostError",
    "LeaseState",
    "acquire",
    "current",
    "fence",
    "release",
    "renew",
    "terms",
]

DECISION_LOOP = "decision-loop"
"""The lease of the decision loop (the row the migration creates)."""


class LeaseLostError(RuntimeError):
    """The daemon no longer holds the lease for its term: another daemon leads."""


class db_epoch(FunctionElement[float]):  # noqa: N801 (an SQL function's name)
    """Seconds since the epoch on the database server's clock."""

    type = Float()
    inherit_cache = True


@compiles(db_epoch)
def _epoch_default(_element: Any, _compiler: Any, **_kw: Any) -> str:
    # clock_timestamp(), not now(): now() is the transaction's start.
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_epoch, "sqlite")
def _epoch_sqlite(_element: Any, _compiler: Any, **_kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@dataclass(frozen=True, slots=True)
class LeaseState:
    holder: str | None
    """The daemon holding (or that last held) the lease; ``None``: never held."""
    term: int
    expires_in_s: float
    """Seconds until it expires, on the database's clock; negative once expired."""

    @property
    def held(self) -> bool:
        return self.holder is not None and self.expires_in_s > 0


def current(session: Session, name: str = DECISION_LOOP) -> LeaseState:
    row = session.execute(
        select(
            LeaderLeaseRow.holder, LeaderLeaseRow.term, LeaderLeaseRow.expires_at_s - db_epoch()
        ).where(LeaderLeaseRow.name == name)
    ).one_or_none()
    if row is None:
        raise LookupError(f"no lease {name!r}: run `autotune db upgrade`")
    holder, term, left = row
    return LeaseState(holder=holder, term=int(term), expires_in_s=float(left))


def renew(
    session: Session, *, holder: str, term: int, lease_s: float, name: str = DECISION_LOOP
) -> bool:
    """Extend the lease by ``lease_s`` from now if ``holder`` still holds it for ``term``
    (even after it expired, as long as nobody took it since); whether it did."""
    return _set_expiry(session, holder, term, name, db_epoch() + lease_s)


def _set_expiry(session: Session, holder: str, term: int, name: str, expires: Any) -> bool:
    """Set the lease's expiry if ``holder`` holds it for ``term``; whether it did."""
    result = session.execute(
        update(LeaderLeaseRow)
        .where(
            LeaderLeaseRow.name == name,
            LeaderLeaseRow.holder == holder,
            LeaderLeaseRow.term == term,
        )
        .values(expires_at_s=expires)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0)) == 1


def acquire(
    session: Session, *, holder: str, lease_s: float, name: str = DECISION_LOOP
) -> int | None:
    """Take the lease if it has expired (or was released): the new term, recorded in
    ``leader_terms``; ``None`` while another daemon holds it."""
    result = session.execute(
        update(LeaderLeaseRow)
        .where(LeaderLeaseRow.name == name, LeaderLeaseRow.expires_at_s < db_epoch())
        .values(holder=holder, term=LeaderLeaseRow.term + 1, expires_at_s=db_epoch() + lease_s)
        .execution_options(synchronize_session=False)
    )
    if int(getattr(result, "rowcount", 0)) != 1:
        return None
    term = int(
        session.execute(select(LeaderLeaseRow.term).where(LeaderLeaseRow.name == name)).scalar_one()
    )
    session.add(LeaderTermRow(term=term, holder=holder, started_at=utc_now()))
    return term


def fence(
    session: Session, *, holder: str, term: int, lease_s: float, name: str = DECISION_LOOP
) -> None:
    """The fencing check of a transaction that writes decisions: renew the lease for
    ``term`` in it (on PostgreSQL the row stays locked until the transaction ends, so no
    one takes the lease before it commits), or raise ``LeaseLostError``."""
    if not renew(session, holder=holder, term=term, lease_s=lease_s, name=name):
        state = current(session, name)
        raise LeaseLostError(
            f"the leader lease is now term {state.term} of {state.holder}, not term {term} "
            f"of {holder}: not storing this tick's writes"
        )


def release(session: Session, *, holder: str, term: int, name: str = DECISION_LOOP) -> bool:
    """Let the lease expire now (a clean stop): another daemon takes over at once."""
    return _set_expiry(session, holder, term, name, 0.0)


def terms(session: Session) -> list[tuple[int, str, int, int | None, int | None]]:
    """Every term, oldest first: ``(term, holder, decisions, first decision id, last
    decision id)``: what a check that no two leaders decided at once reads."""
    from sqlalchemy import func

    counts = {
        term: (n, low, high)
        for term, n, low, high in session.execute(
            select(
                DecisionRow.term,
                func.count(),
                func.min(DecisionRow.id),
                func.max(DecisionRow.id),
            )
            .where(DecisionRow.term.is_not(None))
            .group_by(DecisionRow.term)
        )
    }
    return [
        (row.term, row.holder, *counts.get(row.term, (0, None, None)))
        for row in session.scalars(select(LeaderTermRow).order_by(LeaderTermRow.term))
    ]
