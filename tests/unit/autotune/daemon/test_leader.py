"""Several daemons on one database: the lease holder decides, another takes over when it
stops renewing, a deposed leader stores nothing more; a database that goes away pauses
the ticks instead of failing the policy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from autotune.daemon.leader import Leadership
from autotune.daemon.tick import FALLBACK_AFTER, Daemon, DaemonParts
from autotune.db import Database, sqlite_url
from autotune.db import lease as leases
from autotune.db.tables import DecisionRow, JobRow, LeaderLeaseRow
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy

LEASE_S = 1.0


def _sim() -> SimulatedCluster:
    return SimulatedCluster(SimConfig(seed=0, initial_jobs=6, max_jobs=12))


class Running:
    """A daemon's decision loop and lease keeper in threads, as ``serve`` runs them."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.stop = threading.Event()
        assert daemon.leadership is not None
        self.threads = [
            threading.Thread(target=daemon.run, args=(self.stop, 0.05), daemon=True),
            threading.Thread(target=daemon.leadership.run, args=(self.stop,), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def kill(self) -> None:
        """Stop both threads without releasing the lease (the process died)."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)


def _daemon(url: str, name: str) -> Daemon:
    daemon = Daemon(
        DaemonParts(
            db=Database(url),
            backend=_sim(),
            policy=RulesPolicy(),
            fallback=RulesPolicy(),
            leadership=Leadership(Database(url, pool_size=1), lease_s=LEASE_S, holder=name),
            backend_factory=_sim,
        )
    )
    assert daemon.leadership is not None
    daemon.leadership.step()
    if daemon.leadership.leading:
        assert daemon.leadership.term is not None
        daemon.take_over(daemon.leadership.term, activate=True)
    return daemon


def _terms(db: Database) -> dict[int, list[int]]:
    by_term: dict[int, list[int]] = {}
    with db.session() as session:
        for decision_id, term in session.execute(select(DecisionRow.id, DecisionRow.term)):
            by_term.setdefault(term, []).append(decision_id)
    return by_term


@pytest.fixture
def url(tmp_path: Path) -> str:
    database = Database(sqlite_url(tmp_path / "shared.db"))
    database.upgrade()
    database.dispose()
    return sqlite_url(tmp_path / "shared.db")


def test_the_follower_takes_over_a_dead_leader_and_the_old_one_stores_nothing_more(
    url: str,
) -> None:
    a, b = _daemon(url, "a"), _daemon(url, "b")
    assert a.term == 1
    assert b.term is None  # b follows: it serves, it does not decide
    run_a, run_b = Running(a), Running(b)
    try:
        wait_for("decisions of term 1", lambda: len(_terms(a.db).get(1, [])) >= 6)
        running = {j.spec.job_id for j in a.backend.observe().by_state("running")}
        assert running
        assert b.term is None
        run_a.kill()  # no release: b waits for the lease to expire
        killed = time.monotonic()
        wait_for("b leads", lambda: b.term == 2, timeout_s=LEASE_S + 10)
        took_over_s = time.monotonic() - killed
        assert took_over_s < LEASE_S + 4  # the lease, a try a fifth of it later, a busy CI
        wait_for("decisions of term 2", lambda: _terms(a.db).get(2))
        # b resumed a's jobs from the database, on its own backend: those that had not
        # ended by the kill (a simulated job may finish between the look and the kill)
        resumed = {j.spec.job_id for j in b.backend.observe().jobs}
        with a.db.session() as session:
            ended_before = set(
                session.scalars(
                    select(JobRow.job_id).where(
                        JobRow.job_id.in_(running), JobRow.finished_at.is_not(None)
                    )
                )
            )
        assert running - ended_before <= resumed, ended_before
        # a wakes up still believing it leads: its writes are fenced off
        a.leadership.step()  # it learns it was deposed
        assert a.leadership.take_deposed()
        a._term = 1  # as if it had not looked: the fence alone must stop it
        with pytest.raises(leases.LeaseLostError):
            a.tick()
        terms = _terms(a.db)
        assert set(terms) == {1, 2}
        assert max(terms[1]) < min(terms[2])  # no interleaving: one leader at a time
        with a.db.session() as session:
            history = leases.terms(session)
        assert [(t, holder) for t, holder, *_ in history] == [(1, "a"), (2, "b")]
    finally:
        run_a.kill()
        run_b.kill()


def test_a_deposed_leader_hands_its_backend_back_and_follows(url: str) -> None:
    a = _daemon(url, "a")
    assert a.term == 1
    for _ in range(3):
        a.tick()
    first_backend = a.backend
    with a.db.session() as session:  # another daemon took the expired lease
        session.execute(update(LeaderLeaseRow).values(expires_at_s=0.0))
        assert leases.acquire(session, holder="b", lease_s=30) == 2
    with pytest.raises(leases.LeaseLostError):
        a.tick()
    assert a.leadership is not None
    a.leadership.lost(1)
    assert not a._lead()  # demoted: a fresh backend, nothing decided
    assert a.term is None
    assert a.backend is not first_backend
    assert a.health.ok


@contextmanager
def _database_down(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))

    with monkeypatch.context() as patch:
        patch.setattr(daemon.db, "session", refuse)
        yield


def test_a_database_outage_pauses_the_ticks_and_they_resume(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = Daemon(
        DaemonParts(db=database, backend=_sim(), policy=RulesPolicy(), fallback=RulesPolicy())
    )
    daemon.start()
    daemon.tick()
    with _database_down(daemon, monkeypatch):
        for _ in range(FALLBACK_AFTER + 2):
            with pytest.raises(OperationalError):
                daemon.tick()
        health = daemon.health
        assert health.paused is not None
        assert "connection refused" in health.paused
        assert health.consecutive_failures == 0  # the policy did not fail
        assert health.fallback is None
        assert health.describe() is not None
        assert "ticks paused" in (health.describe() or "")
    daemon.tick()
    assert daemon.health.ok
    assert daemon.health.paused is None


def test_decisions_applied_before_the_database_failed_are_marked_at_the_next_tick(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _sim()
    daemon = Daemon(DaemonParts(db=database, backend=backend, policy=RulesPolicy()))
    daemon.start()
    applied: list[int] = []
    apply = backend.apply

    def apply_then_lose_the_database(decisions: Any) -> None:
        apply(decisions)
        applied.extend(d.decision_id for d in decisions)

        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise OperationalError("COMMIT", {}, ConnectionResetError("connection reset"))

        monkeypatch.setattr(daemon.db, "session", refuse)

    monkeypatch.setattr(backend, "apply", apply_then_lose_the_database)
    with pytest.raises(OperationalError):
        daemon.tick()
    assert applied
    monkeypatch.undo()
    with database.session() as session:
        marked = session.scalars(
            select(DecisionRow.id).where(DecisionRow.applied_at.is_not(None))
        ).all()
    assert not set(applied) & set(marked)  # applied, but the database did not hear it
    daemon.tick()
    with database.session() as session:
        marked = session.scalars(
            select(DecisionRow.id).where(DecisionRow.applied_at.is_not(None))
        ).all()
    assert set(applied) <= set(marked)


def test_a_leader_cut_off_from_the_database_pauses_then_renews_its_own_term(url: str) -> None:
    a = _daemon(url, "a")
    assert a.leadership is not None
    a.tick()

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("UPDATE", {}, ConnectionRefusedError("connection refused"))

    real = a.leadership.db.session
    a.leadership.db.session = refuse  # type: ignore[method-assign]
    time.sleep(LEASE_S + 0.1)
    a.leadership.step()
    assert not a.leadership.leading
    assert not a._lead()  # paused, not demoted: nobody else took the lease
    assert a.term == 1
    assert a.health.paused is not None
    assert "lease was not renewed" in a.health.paused
    a.leadership.db.session = real  # type: ignore[method-assign]
    a.leadership.step()
    assert a.leadership.leading
    assert a._lead()
    a.tick()
    assert a.health.paused is None
    assert a.term == 1


def test_a_leader_cut_off_from_the_database_is_replaced_and_steps_down_when_back(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition between the leader and the database (the follower still reaches it):
    the follower takes over once the lease expires; when the old leader reaches the
    database again it finds the new term, hands its backend back and follows."""
    a, b = _daemon(url, "a"), _daemon(url, "b")
    assert a.leadership is not None
    run_a, run_b = Running(a), Running(b)
    try:
        wait_for("decisions of term 1", lambda: _terms(b.db).get(1))

        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise OperationalError("UPDATE", {}, TimeoutError("no route to host"))

        cut = time.monotonic()
        monkeypatch.setattr(a.db, "session", refuse)
        monkeypatch.setattr(a.leadership.db, "session", refuse)
        wait_for("b leads", lambda: b.term == 2, timeout_s=LEASE_S + 10)
        assert time.monotonic() - cut < LEASE_S + 4
        # It pauses; or a tick it began before the cut met the new term at its fenced
        # write, and it stepped down at once (the pause then lasts until its next turn,
        # too short to be seen on a loaded machine).
        wait_for("a pauses", lambda: a.health.paused is not None or a.term is None)
        monkeypatch.undo()  # a reaches the database again
        wait_for("a steps down", lambda: a.term is None and not a.leadership.leading)
        wait_for("decisions of term 2", lambda: _terms(b.db).get(2))
        terms = _terms(b.db)
        assert max(terms[1]) < min(terms[2])
        assert a.term is None  # it follows: no decision of its own since
        time.sleep(0.5)
        assert max(_terms(b.db)[1]) == max(terms[1])
    finally:
        run_a.kill()
        run_b.kill()
